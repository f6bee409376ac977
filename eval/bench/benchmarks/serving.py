"""`bench serving`: load-test `dllm-decode serve` against offline `generate`
(`dllm_decode.eval.bench.serving`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.benchmarks.checks import diffusion_named
from dllm_decode.eval.bench.protocol import (GEN_LENGTH, MODEL, THREADS, Benchmark, Say, Settings, count, fill,
                                             later)


def run(settings: Settings, say: Say) -> dict[str, Any]:
    from dllm_decode.eval.bench.serving import ServingOptions, run as load_test

    diffusion_named(settings.get("model", "embedded"))
    options = fill(ServingOptions, settings, "--block-length")   # counts are checked by click
    return load_test(options, say)


BENCHMARK = Benchmark(
    "serving",
    "Load-test `dllm-decode serve` on 127.0.0.1: the same requests from one client at a time and from "
    "many concurrent clients, checked against offline `generate` (lost, failed, different answers, "
    "requests/s, p50/p99 latency, the concurrent/sequential ratio).",
    "Defaults: 320 task prompts, 64 clients, max batch 32, gen 32, block 8, threshold 0.9; --quick: "
    "12 prompts, 4 clients, max batch 4, gen 16.",
    (MODEL, THREADS, count("--requests", "requests", "Task prompts sent [320]."),
     count("--clients", "clients", "Concurrent clients [64]."),
     count("--max-batch", "max_batch", "Engine rows [32]."), GEN_LENGTH.but(help="Canvas length [32]."),
     count("--block-length", "block_length", "Block length [8].")),
    run, later("dllm_decode.eval.bench.serving", "format_serving"),
    quick=dict(requests=12, clients=4, max_batch=4, gen_length=16))
