"""The tables in README.md from each folder's samples.jsonl: per setting, accuracy with its 95%
Wilson interval, mean NFE, forward rows (LEAP's look-ahead canvases) per answer token, and the
paired accuracy change against `threshold` 0.9 with no cache on the same prompts (mean of the
per-prompt score differences, with a 95% normal interval). Run: python table.py [FOLDER...]."""

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


def label(config: dict) -> str:
    """`rule:changed=options cache name:changed=options` (fields at their defaults left out)."""
    from dllm_decode.registry import component, component_dict

    def named(part: dict) -> str:
        kind = "cache" if part is config["cache"] else "scheduler"
        default = json.loads(json.dumps(component_dict(type(component(kind, part))())))
        opts = ",".join(f"{k}={v}" for k, v in part.items() if k != "name" and default.get(k) != v)
        return part["name"] + (f":{opts}" if opts else "")
    cache = config["cache"]
    return named(config["scheduler"]) + ("" if cache["name"] == "none" else f" cache {named(cache)}")


def table(folder: Path) -> None:
    runs: dict[str, dict] = defaultdict(dict)
    for line in (folder / "samples.jsonl").open():
        r = json.loads(line)
        runs[label(r["decode_config"])][(r["task"], r["index"])] = r
    base = runs.get("threshold", {})
    print(f"\n{folder.name}\n")
    print("| setting | n | accuracy % (95% interval) | mean NFE | forward rows / answer token | change vs threshold 0.9 (95%) |")
    print("|---|---|---|---|---|---|")
    for name, rows in runs.items():
        n, k = len(rows), sum(r["score"] for r in rows.values())
        answer = sum(r["answer_tokens_per_step"] * r["nfe"] for r in rows.values()) or 1
        lo, hi = wilson(k, n)
        shared = [key for key in rows if key in base]
        diffs = [rows[key]["score"] - base[key]["score"] for key in shared]
        if diffs and name != "threshold":
            mean = sum(diffs) / len(diffs)
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(len(diffs) - 1, 1))
            change = f"{100 * mean:+.1f} ({100 * (mean - 1.96 * sd / math.sqrt(len(diffs))):+.1f}, {100 * (mean + 1.96 * sd / math.sqrt(len(diffs))):+.1f})"
        else:
            change = "-"
        print(f"| `{name}` | {n} | {100 * k / n:.1f} ({lo:.1f}-{hi:.1f}) | "
              f"{sum(r['nfe'] for r in rows.values()) / n:.2f} | "
              f"{sum(r['forward_rows'] for r in rows.values()) / answer:.3f} | {change} |")


here = Path(__file__).parent
for name in sys.argv[1:] or ["embedded", "embedded_256", "ideal"]:
    table(here / name)
