"""Each self-speculative row against the best single-model rule at equal accuracy.

"Best single-model rule at equal accuracy": of the `generate` rows (rules under the block cache),
the one with the fewest forwards per answer token whose pooled accuracy is at least the decoder's.
Usage: python compare.py OUT.md DIR [DIR ...]  (reads each DIR/rows.jsonl, writes OUT.md)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    out = Path(sys.argv[1])
    rows = [json.loads(line) for folder in sys.argv[2:]
            for line in (Path(folder) / "rows.jsonl").read_text().splitlines()]
    rules = [r for r in rows if r["kind"] == "generate"]
    lines = ["| row | n | accuracy % (95% CI) | forwards / answer token (95% CI) | rows / answer token | "
             "verify share | best rule at >= its accuracy | its fwd / answer token | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        better = [x for x in rules if x["accuracy"] >= r["accuracy"] and x is not r]
        best = min(better, key=lambda x: x["forwards_per_answer_token"]) if better else None
        fpat = r["forwards_per_answer_token"]
        versus = (f"{best['label']} | {best['forwards_per_answer_token']:.3f} | "
                  f"{fpat / best['forwards_per_answer_token']:.2f}x") if best else "none as accurate | - | -"
        (lo, hi), (f_lo, f_hi) = r["accuracy_95"], r["fpat_95"]
        lines.append(f"| {r['label']} | {r['n']} | {r['accuracy']:.1f} ({lo:.1f}-{hi:.1f}) | {fpat:.3f} "
                     f"({f_lo:.3f}-{f_hi:.3f}) | {r['rows_per_answer_token']:.3f} | {r['verify_share']:.2f} | "
                     f"{versus} |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
