"""accuracy.md from samples.jsonl: per attention setting, accuracy with its 95% Wilson interval,
mean NFE, the share of forwards that ran sparse (forwards after the switch step E), and the
paired accuracy change against dense on the same prompts (mean of the per-prompt score
differences, 95% normal interval). Run: python table.py FOLDER."""

import json
import math
import sys
from collections import defaultdict
from pathlib import Path


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100 * (centre - half), 100 * (centre + half)


def sparse_forwards(label: str, nfe: int) -> int:
    """Forwards after the switch step E = int(T * skip) + 1 (T = gen 32); each forward here
    commits a token, so the step count n equals the forward index."""
    from dllm_decode.models.attention import parse_attention

    if "--attention" not in label:
        return 0
    options = parse_attention(label.split("--attention ")[1])
    switch = int(32 * options.skip) + 1
    return max(0, nfe - switch - 1)


folder = Path(sys.argv[1])
runs: dict[str, dict] = defaultdict(dict)
for line in (folder / "samples.jsonl").open():
    r = json.loads(line)
    runs[(r["label"], r["model"])][(r["task"], r["index"])] = r
print("| rule | attention | n | accuracy % (95% interval) | mean NFE | sparse forwards % | change vs dense (95%) | prompts changed |")
print("|---|---|---|---|---|---|---|---|")
for (rule, name), rows in runs.items():
    base = runs[(rule, "embedded")]
    n, k = len(rows), sum(r["score"] for r in rows.values())
    lo, hi = wilson(k, n)
    nfe = sum(r["nfe"] for r in rows.values())
    sparse = sum(sparse_forwards(name, r["nfe"]) for r in rows.values())
    diffs = [rows[key]["score"] - base[key]["score"] for key in rows if key in base]
    mean = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(len(diffs) - 1, 1))
    half = 1.96 * sd / math.sqrt(len(diffs))
    changed = sum(rows[key]["output"] != base[key]["output"] for key in rows if key in base)
    setting = name.split("--attention ")[1] if "--attention" in name else "dense"
    print(f"| `{rule}` | `{setting}` | {n} | {100 * k / n:.1f} ({lo:.1f}-{hi:.1f}) | {nfe / n:.2f} | "
          f"{100 * sparse / nfe:.0f} | {100 * mean:+.1f} ({100 * (mean - half):+.1f}, {100 * (mean + half):+.1f}) | {changed} |")
