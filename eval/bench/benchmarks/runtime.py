"""`bench runtime`: one forward, the reference blocks against the compact runtime
(`dllm_decode.eval.bench.forward`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.benchmarks.checks import subject
from dllm_decode.eval.bench.protocol import (DEVICE, DTYPE, SHARED, Benchmark, Option, Say, Settings, blame,
                                             count, later)


def run(settings: Settings, say: Say) -> dict[str, Any]:
    from dllm_decode.devices import DTYPES, check_device, device_name
    from dllm_decode.eval.bench.forward import profile_runtime, runtime_speedup
    from dllm_decode.eval.bench.subject import samples_for

    with blame("--device"):
        device = check_device(settings["device"]) if settings.get("device") else None
    bench = subject(settings)
    dtype = settings.get("dtype")
    if device is not None or dtype is not None:
        bench.model.to(device=device, dtype=DTYPES[dtype] if dtype else None)
    gen, block = settings.get("gen_length", 256), settings.get("block_length", 32)
    repeats, batches = settings.get("repeats", 15), settings.get("batch_sizes") or (1,)
    prompts = [s.prompt for s in samples_for(bench, settings.get("per_task", 1), tasks=None)][:max(batches)]
    say(f"{bench.label}: batch {', '.join(map(str, batches))}, {repeats} interleaved repeats ...")
    rows = runtime_speedup(bench.model, prompts, bench.tokenizer, gen, block, repeats, batches)
    weights = next(bench.model.parameters())
    report = {"model": settings.get("model", "embedded"), "runtime": rows, "gen_length": gen,
              "block_length": block, "repeats": repeats, "threads": settings.get("threads", 1),
              "device": device_name(weights.device), "dtype": str(weights.dtype)}
    if settings.get("profile"):
        report["profile"] = profile_runtime(bench.model, prompts[:1], bench.tokenizer, gen, block)
    return report


BENCHMARK = Benchmark(
    "runtime",
    "One forward, the reference blocks against the compact runtime (fused projections, rotary "
    "lookup): a full forward and a cached block step, ratios of interleaved medians, and how far "
    "the logits differ.",
    "Defaults: gen 256, block 32, batch 1, 15 interleaved repeats; --quick: gen 32, block 8, 3 repeats.",
    SHARED + (count("--block-length", "block_length", "Rows of the cached step [32]."),
              count("--batch-size", "batch_sizes", "Prompts per forward; repeatable [1].", multiple=True),
              Option(("--profile",), "profile", bool, "Also print the torch profiler's top ops of each "
                     "compact forward."),
              DEVICE, DTYPE.but(help="Weights and activations [the model's own].")),
    run, later("dllm_decode.eval.bench.forward", "format_runtime"),
    quick=dict(gen_length=32, block_length=8, repeats=3))
