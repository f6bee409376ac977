"""Per-rank loading memory, TP logits error and collective counts at TP = 2 (gloo, CPU).

Run from the repository root: `python measurements/cpu_2026-11-27b/tp_core/measure.py`.
Writes `results.json` beside this file: each rank's record of `tests/distributed/tp_ranks.py`'s
`load` task (a 4-shard float32 LLaDA-layout checkpoint of 134 MB) and `logits` task (every dense
family, both runtimes, and the DTensor plan).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from dllm_decode.outputs import atomic_write  # noqa: E402
from tests.distributed.harness import run_ranks  # noqa: E402
from tests.distributed.test_tp import FAST_FAMILIES, write_sharded_checkpoint  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    checkpoint = Path(tmp) / "ckpt"
    checkpoint.mkdir()
    full = write_sharded_checkpoint(checkpoint)
    load = run_ranks("tests.distributed.tp_ranks", 2, Path(tmp) / "load", "load", str(checkpoint))
    logits = run_ranks("tests.distributed.tp_ranks", 2, Path(tmp) / "logits", "logits", FAST_FAMILIES)
summary = {
    "checkpoint_bytes": full,
    "anon_growth_over_checkpoint": [r["anon_growth"] / full for r in load],
    "resident_over_whole": [r["resident"] / r["whole_resident"] for r in load],
    "max_ulps": max(v["ulps"] for v in logits[0].values()),
    "ranks_bitwise_equal": all(logits[0][k].get("digest") == logits[1][k].get("digest")
                               for k in logits[0]),
}
atomic_write(HERE / "results.json", json.dumps({"summary": summary, "load": load, "logits": logits},
                                               indent=1), "measurement")
print(json.dumps(summary, indent=1))
