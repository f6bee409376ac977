"""Weight bytes, resident tensor bytes and CPU forward time per weight format, side by side.

    OMP_NUM_THREADS=1 nice -n 10 python measurements/cpu_2026-11-29_quant/measure.py OUT.json

Per embedded model (bfloat16 activations): stored bytes of every parameter and buffer
(`quant.weight_bytes`), resident tensor bytes after a forward (stored + what the kernels derive:
torchao's repacked int4 and its scale table; int8 / fp8 wrap the codes without a copy), and the
median and the fastest time of a forward (batch 1 and 8, canvas 64), the formats interleaved
round by round so machine load hits all alike (on a loaded machine the fastest round is the
steadier figure). Then one 4096 x 4096 linear at batch 1 and 32 (a weight-read-bound
shape), the same way.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from torch import nn

from dllm_decode.models import load_model
from dllm_decode.quant import QuantLinear, quantize_model, weight_bytes

FORMATS = (None, "int8", "fp8", "int4:64")
ROUNDS = 25


def resident(model: nn.Module) -> int:
    """Stored bytes plus the tensors the kernels derived from them (not sharing their storage)."""
    derived = 0
    for m in model.modules():
        if isinstance(m, QuantLinear) and "_ao" in m.__dict__:
            weight = m.__dict__["_ao"][1]
            inners = [getattr(weight, n) for n in weight.__tensor_flatten__()[0]] \
                if hasattr(weight, "__tensor_flatten__") else [weight]
            own = {t.untyped_storage().data_ptr() for t in m.codes() if t is not None}
            derived += sum(t.untyped_storage().nbytes() for t in inners
                           if t is not None and t.untyped_storage().data_ptr() not in own)
    return weight_bytes(model) + derived


def timed(fn, rounds: dict[str, list[float]], key: str) -> None:
    start = time.perf_counter()
    fn()
    rounds.setdefault(key, []).append(time.perf_counter() - start)


def models_side_by_side(name: str) -> dict:
    built = {}
    for fmt in FORMATS:
        model = load_model(name, dtype=torch.bfloat16, runtime="reference")
        built[fmt or "bf16"] = model if fmt is None else quantize_model(model, fmt)
    built["bf16-compact"] = load_model(name, dtype=torch.bfloat16, runtime="compact")
    inputs = {b: torch.randint(0, 120, (b, 64), generator=torch.Generator().manual_seed(b))
              for b in (1, 8)}
    times: dict[str, list[float]] = {}
    with torch.inference_mode():
        for model in built.values():
            model(inputs[1])                               # warm up (torchao wrappers built)
        for _ in range(ROUNDS):
            for key, model in built.items():
                for batch, ids in inputs.items():
                    timed(lambda: model(ids), times, f"{key}/b{batch}")
    out = {}
    base = weight_bytes(built["bf16"])
    for key, model in built.items():
        row = {"weight_bytes": weight_bytes(model), "x_bf16": weight_bytes(model) / base,
               "resident_bytes": resident(model)}
        for batch in (1, 8):
            row.update(_speed(times, key, f"b{batch}"))
        out[key] = row
    return out


def linear_side_by_side() -> dict:
    torch.manual_seed(0)
    layer = nn.Linear(4096, 4096, bias=False).to(torch.bfloat16)
    layers = {"bf16": layer}
    for fmt in FORMATS[1:]:
        name, _, group = fmt.partition(":")
        layers[fmt] = QuantLinear.from_linear(layer, name, int(group) if group else None)
    xs = {b: torch.randn(b, 4096, dtype=torch.bfloat16) for b in (1, 32)}
    times: dict[str, list[float]] = {}
    with torch.inference_mode():
        for m in layers.values():
            m(xs[1])
        for _ in range(ROUNDS):
            for key, m in layers.items():
                for b, x in xs.items():
                    timed(lambda: m(x), times, f"{key}/b{b}")
    out = {}
    for key in layers:
        row = {}
        for b in (1, 32):
            row.update(_speed(times, key, f"b{b}"))
        out[key] = row
    return out


def _speed(times: dict[str, list[float]], key: str, shape: str) -> dict[str, float]:
    """Median and fastest ms of `key` at `shape`, and each as a multiple of bf16's."""
    own, ref = times[f"{key}/{shape}"], times[f"bf16/{shape}"]
    return {f"ms_{shape}": statistics.median(own) * 1e3,
            f"x_bf16_{shape}": statistics.median(own) / statistics.median(ref),
            f"min_ms_{shape}": min(own) * 1e3, f"min_x_bf16_{shape}": min(own) / min(ref)}


def main() -> None:
    torch.set_num_threads(1)
    result = {"rounds": ROUNDS, "threads": 1, "torch": torch.__version__,
              "linear_4096": linear_side_by_side()}
    for name in ("embedded", "embedded-bd"):
        result[name] = models_side_by_side(name)
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
