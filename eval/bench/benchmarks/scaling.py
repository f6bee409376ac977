"""`bench scaling`: time per sample against the generation length (`dllm_decode.eval.bench.scaling`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.benchmarks.checks import cache_variants, subject
from dllm_decode.eval.bench.protocol import (GEN_LENGTH, GEN_LENGTHS, SHARED, Benchmark, Option, Say,
                                             Settings, blame, count, fill, later)


def run(settings: Settings, say: Say) -> dict[str, Any]:
    from dllm_decode.eval.bench.scaling import ScalingOptions, lengths_for, run_scaling
    from dllm_decode.eval.bench.subject import machine

    options = fill(ScalingOptions, settings, caches=cache_variants(settings.get("caches", ()), "--cache"))
    bench = subject(settings)
    with blame("--gen-length"):
        lengths_for(bench, options)
    return {"machine": machine(settings.get("threads", 1)), **run_scaling(bench, options, say)}


BENCHMARK = Benchmark(
    "scaling",
    "Time per sample against gen length, for the default decode (threshold, no cache), one token per "
    "step and the default decode under each --cache, with the fitted exponent (log-log least squares).",
    "Defaults: gen 64, 128, 256, ... up to the context, 1 prompt per task of every task, batch 8, "
    "block 32, 3 repeats; --quick: gen 16, 32, 64, block 16, batch 4, 1 repeat.",
    tuple(GEN_LENGTHS if o is GEN_LENGTH else o for o in SHARED) + (
        count("--batch", "batch", "Prompts per decode call."),
        Option(("--cache",), "caches", str, "Also time the default decode under this cache (e.g. "
               "suffix); repeatable.", multiple=True, metavar="NAME[:KEY=VALUE,...]",
               registry="cache"),
    ),
    run, later("dllm_decode.eval.bench.report", "format_scaling"),
    quick=dict(gen_lengths=(16, 32, 64), block_length=16, batch=4, per_task=1, repeats=1))
