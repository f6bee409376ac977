"""`bench serving`: load-test `dllm-decode serve` against offline `generate`
(`dllm_decode.eval.bench.serving`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.benchmarks.checks import diffusion_named
from dllm_decode.eval.bench.protocol import (GEN_LENGTH, MODEL, REPEATS, THREADS, Benchmark, Option, Say,
                                             Settings, count, fill, later)


def run(settings: Settings, say: Say) -> dict[str, Any]:
    if settings.get("workload") == "shared-prefix":
        from dllm_decode.eval.bench.shared_prefix import SharedPrefixOptions, run as shared

        diffusion_named(settings.get("model", "embedded-bd"))
        return shared(fill(SharedPrefixOptions, settings, "--prefix-tokens"), say)
    from dllm_decode.eval.bench.serving import ServingOptions, run as load_test

    diffusion_named(settings.get("model", "embedded"))
    options = fill(ServingOptions, settings, "--block-length")   # counts are checked by click
    return load_test(options, say)


def show(report: dict[str, Any]) -> str:
    if report.get("workload") == "shared-prefix":
        from dllm_decode.eval.bench.shared_prefix import format_shared_prefix

        return format_shared_prefix(report)
    from dllm_decode.eval.bench.serving import format_serving

    return format_serving(report)


BENCHMARK = Benchmark(
    "serving",
    "Load-test `dllm-decode serve` on 127.0.0.1: the same requests from one client at a time and from "
    "many concurrent clients, checked against offline `generate` (lost, failed, different answers, "
    "requests/s, p50/p99 latency, the concurrent/sequential ratio).",
    "Defaults: 320 task prompts, 64 clients, max batch 32, gen 32, block 8, threshold 0.9; --quick: "
    "12 prompts, 4 clients, max batch 4, gen 16. `--workload shared-prefix` (model embedded-bd, block "
    "cache; or embedded-noise at its shipped decoding): 48 requests sharing a 256-token system prompt plus 8 two-turn chats, 8 clients, max batch 8, "
    "served with and without the prefix cache (--prefix-cache-bytes, 64 MiB) in --repeats alternating "
    "pairs [2]: requests/s, time to first text, identical answers.",
    (MODEL.but(default=None, help=MODEL.help + " [embedded; shared-prefix: embedded-bd]"), THREADS,
     count("--requests", "requests", "Task prompts sent [320]."),
     count("--clients", "clients", "Concurrent clients [64]."),
     count("--max-batch", "max_batch", "Engine rows [32]."), GEN_LENGTH.but(help="Canvas length [32]."),
     count("--block-length", "block_length", "Block length [8]."),
     Option(("--workload",), "workload", ("tasks", "shared-prefix"), "Task prompts, or requests sharing a "
            "long system prompt and two-turn chats, with and without the prefix cache [tasks]."),
     count("--chats", "chats", "shared-prefix: two-turn chats [8]."),
     count("--prefix-tokens", "prefix_tokens", "shared-prefix: tokens of the shared system prompt [256]."),
     count("--prefix-cache-bytes", "prefix_cache_bytes", "shared-prefix: the prefix cache's budget [64 MiB]."),
     REPEATS.but(help="shared-prefix: alternating off/on pairs [2].")),
    run, show,
    quick=dict(requests=12, clients=4, max_batch=4, gen_length=16))
