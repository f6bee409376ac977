"""The paired accuracy change of each setting against `threshold` 0.9 with the dual cache, on the
same prompts (mean of the per-prompt score differences, 95% normal interval), from each folder's
samples.jsonl; `measurements/cpu_2026-11-29-rules/table.py` gives the rest (accuracy, Wilson
interval, NFE, change against no cache). Run: python paired.py [FOLDER...]."""

import json
import math
import sys
from collections import defaultdict
from pathlib import Path


def key(config: dict) -> str:
    """`rule cache name:changed=options` (cache fields at their defaults left out)."""
    from dllm_decode.registry import component, component_dict

    cache = config["cache"]
    default = json.loads(json.dumps(component_dict(type(component("cache", cache))())))
    options = ",".join(f"{k}={v}" for k, v in cache.items() if k != "name" and default.get(k) != v)
    return config["scheduler"]["name"] + " cache " + cache["name"] + (f":{options}" if options else "")


def paired(folder: Path, base: str = "threshold cache dual") -> None:
    runs: dict[str, dict] = defaultdict(dict)
    for line in (folder / "samples.jsonl").open():
        r = json.loads(line)
        runs[key(r["decode_config"])][(r["task"], r["index"])] = r["score"]
    print(f"\n{folder.name}: change vs `{base}` (paired, 95%)\n")
    for name, scores in runs.items():
        diffs = [scores[k] - runs[base][k] for k in scores if k in runs[base]]
        mean = sum(diffs) / len(diffs)
        half = 1.96 * math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(len(diffs) - 1, 1) / len(diffs))
        print(f"* `{name}` (n = {len(diffs)}): {100 * mean:+.1f} ({100 * (mean - half):+.1f}, {100 * (mean + half):+.1f})")


here = Path(__file__).parent
for name in sys.argv[1:] or ["embedded", "embedded_256"]:
    paired(here / name)
