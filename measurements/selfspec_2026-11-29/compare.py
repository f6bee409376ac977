"""Each self-speculative row against the best single-model rule at equal accuracy.

"Best single-model rule at equal accuracy": of the `generate` rows (rules under the block cache),
the one with the fewest forwards per answer token whose pooled accuracy is at least the decoder's.
Usage: python compare.py OUT.md DIR [DIR ...]  (reads each DIR/rows.jsonl, writes OUT.md)
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path


def paired_ratio(a: list[dict], b: list[dict], draws: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval (over prompts, paired) of sum(forwards a) / sum(forwards b)."""
    rng = random.Random(0)
    assert [x["i"] for x in a] == [y["i"] for y in b], "unpaired samples"
    n, values = len(a), []
    for _ in range(draws):
        pick = [rng.randrange(n) for _ in range(n)]
        values.append(sum(a[i]["nfe"] for i in pick) / sum(b[i]["nfe"] for i in pick))
    values.sort()
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


STRICT_PAIRS = [("s2d2 strict, block 8", "AR mode (block size 1)"),
                ("s2d2 strict, block 4", "AR mode (block size 1)"),
                ("simsd strict (draft threshold 0.9)", "AR mode (block size 1)"),
                ("simsd strict (draft threshold 0.7)", "AR mode (block size 1)"),
                *[(f"psd strict K={k} on threshold {t}", f"threshold {t} +block")
                  for t in (0.7, 0.8, 0.9, 0.95) for k in (2, 4, 8)],
                ("psd strict K=4 on low_confidence 1/step", "low_confidence 1/step +block")]
"""Each strict decoder and the decode it reproduces (same answers expected)."""


def main() -> None:
    out = Path(sys.argv[1])
    by_label: dict[str, dict] = {}             # a label measured again in a later folder: the later
    for folder in sys.argv[2:]:
        for line in (Path(folder) / "rows.jsonl").read_text().splitlines():
            row = json.loads(line)
            by_label.pop(row["label"], None)
            by_label[row["label"]] = row
    rows = list(by_label.values())
    samples: dict[str, list[dict]] = {}
    for folder in sys.argv[2:]:
        found: dict[str, list[dict]] = {}
        for line in (Path(folder) / "samples.jsonl").read_text().splitlines():
            sample = json.loads(line)
            found.setdefault(sample["label"], []).append(sample)
        samples.update(found)
    rules = [r for r in rows if r["kind"] == "generate"]
    lines = ["| row | n | accuracy % (95% CI) | forwards / answer token (95% CI) | rows / answer token | "
             "verify share | best rule at >= its accuracy | its fwd / answer token | forwards ratio "
             "(paired 95% CI) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        better = [x for x in rules if x["accuracy"] >= r["accuracy"] and x is not r]
        best = min(better, key=lambda x: x["forwards_per_answer_token"]) if better else None
        fpat = r["forwards_per_answer_token"]
        versus = "none as accurate | - | -"
        if best and len(samples.get(r["label"], ())) == len(samples[best["label"]]):
            lo_r, hi_r = paired_ratio(samples[r["label"]], samples[best["label"]])
            versus = (f"{best['label']} | {best['forwards_per_answer_token']:.3f} | "
                      f"{fpat / best['forwards_per_answer_token']:.2f}x ({lo_r:.2f}-{hi_r:.2f})")
        (lo, hi), (f_lo, f_hi) = r["accuracy_95"], r["fpat_95"]
        lines.append(f"| {r['label']} | {r['n']} | {r['accuracy']:.1f} ({lo:.1f}-{hi:.1f}) | {fpat:.3f} "
                     f"({f_lo:.3f}-{f_hi:.3f}) | {r['rows_per_answer_token']:.3f} | {r['verify_share']:.2f} | "
                     f"{versus} |")
    lines += ["", "Strict modes against the decode each reproduces (paired, same prompts):", "",
              "| strict row | base | answers identical | forwards ratio (paired 95% CI) |", "|---|---|---|---|"]
    for label, base in STRICT_PAIRS:
        if label in samples and base in samples and len(samples[label]) == len(samples[base]):
            a, b = samples[label], samples[base]
            same = sum(x["text"] == y["text"] for x, y in zip(a, b))
            ratio = sum(x["nfe"] for x in a) / sum(y["nfe"] for y in b)
            lo_r, hi_r = paired_ratio(a, b)
            lines.append(f"| {label} | {base} | {same} of {len(a)} | {ratio:.2f}x ({lo_r:.2f}-{hi_r:.2f}) |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
