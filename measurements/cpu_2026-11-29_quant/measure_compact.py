"""Quantized models in the compact runtime (q|k|v and gate|up fused from the codes) against the
reference runtime: forward time side by side, plus stored and resident bytes of the int4 layout
with integer zero points.

    OMP_NUM_THREADS=1 nice -n 10 python measurements/cpu_2026-11-29_quant/measure_compact.py \
        measurements/cpu_2026-11-29_quant/measure_compact.json

Embedded model, bfloat16, one thread; 15 interleaved rounds of a batch-1 and a batch-8 forward
over 64 tokens; reports the median and fastest time per (format, runtime) and compact /
reference ratios of each.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from measure import resident  # noqa: E402

from dllm_decode.models import load_model  # noqa: E402
from dllm_decode.models.compact import set_runtime  # noqa: E402
from dllm_decode.quant import weight_bytes  # noqa: E402

FORMATS = ("int8", "fp8", "int4:64")
ROUNDS = 15


def main(out: str) -> None:
    torch.set_num_threads(1)
    built = {}
    for fmt in FORMATS:
        for runtime in ("reference", "compact"):
            model = load_model("embedded", dtype=torch.bfloat16, quantize=fmt)
            built[f"{fmt}/{runtime}"] = set_runtime(model, runtime)
    inputs = {b: torch.randint(4, 120, (b, 64), generator=torch.Generator().manual_seed(b)) for b in (1, 8)}
    times: dict[str, list[float]] = {}
    with torch.inference_mode():
        for model in built.values():
            model(inputs[1])
        for _ in range(ROUNDS):
            for key, model in built.items():
                for batch, ids in inputs.items():
                    start = time.perf_counter()
                    model(ids)
                    times.setdefault(f"{key}/b{batch}", []).append(time.perf_counter() - start)
    report: dict = {"rounds": ROUNDS, "models": {}}
    for key, model in built.items():
        row = {"weight_bytes": weight_bytes(model), "resident_bytes": resident(model)}
        for batch in (1, 8):
            t = times[f"{key}/b{batch}"]
            row[f"b{batch}_median_ms"], row[f"b{batch}_fastest_ms"] = 1e3 * statistics.median(t), 1e3 * min(t)
        report["models"][key] = row
    for fmt in FORMATS:
        ref, com = report["models"][f"{fmt}/reference"], report["models"][f"{fmt}/compact"]
        report[f"{fmt} compact/reference"] = {
            k: com[k] / ref[k] for k in ("b1_median_ms", "b1_fastest_ms", "b8_median_ms", "b8_fastest_ms")}
    Path(out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if "/" in k}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
