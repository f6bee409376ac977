"""The table in README.md from runs/<rule>/samples.jsonl: accuracy with its 95% Wilson interval,
and forwards per answer token (sum over prompts of the forwards / sum of the answer tokens, an
answer token being one before the first end-of-text), counting dLLM forwards (NFE), canvas rows
(forward_rows: info_gain's look-ahead candidates) and NFE + guide_nfe (apd's AR verifier).
Run: python table.py (after run_new_rules.sh)."""

import json
import math
from pathlib import Path

RULES = ["threshold", "low_confidence", "apd", "info_gain", "remdm"]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100 * (centre - half), 100 * (centre + half)


print("| rule | n | accuracy % (95% interval) | NFE / answer token | rows / answer token "
      "| (NFE + guide NFE) / answer token |")
print("|---|---|---|---|---|---|")
here = Path(__file__).parent
for rule in RULES:
    rows = [json.loads(line) for line in (here / "runs" / rule / "samples.jsonl").open()]
    n, k = len(rows), sum(int(r["score"] >= 1.0) for r in rows)
    answer = sum(r["answer_tokens_per_step"] * r["nfe"] for r in rows)
    nfe = sum(r["nfe"] for r in rows)
    frows = sum(r["forward_rows"] for r in rows)
    guide = sum(r["guide_nfe"] for r in rows)
    lo, hi = wilson(k, n)
    print(f"| `{rule}` | {n} | {100 * k / n:.1f} ({lo:.1f}-{hi:.1f}) | {nfe / answer:.3f} | "
          f"{frows / answer:.3f} | {(nfe + guide) / answer:.3f} |")
