"""`bench cache`: the block KV caches side by side (`dllm_decode.eval.bench.cache`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.benchmarks.checks import cache_variants, subject
from dllm_decode.eval.bench.protocol import (GEN_LENGTH, GEN_LENGTHS, KV_CACHE_DTYPE, SHARED, Benchmark,
                                             Option, Say, Settings, count, fill, fraction, later)


def run(settings: Settings, say: Say) -> dict[str, Any]:
    from dllm_decode.eval.bench.cache import CacheOptions, run_cache
    from dllm_decode.eval.bench.subject import machine

    variants = cache_variants(settings.get("variants", ()), "--variant")
    options = fill(CacheOptions, settings, variants=variants)
    return {"machine": machine(settings.get("threads", 1)),
            "kv_cache_dtype": settings.get("kv_cache_dtype", "auto"), **run_cache(subject(settings), options, say)}


BENCHMARK = Benchmark(
    "cache",
    "The caches (none, prefix, dual, d2, elastic, suffix, dpad, variants) over many prompts and batch "
    "sizes: seconds per sample, answer and canvas tokens per second, NFE, speedup over none and over "
    "dual (vs_dual), agreement with none and accuracy; one forward's cost at the first block beside "
    "each cell.",
    "Defaults: 4 prompts per task of every task (48), gen 256 and 512, batch 1, 4 and 16, 3 repeats, "
    "threshold 0.9, block 32; --quick: 1 per task, gen 64, batch 1 and 4, 1 repeat.",
    tuple(GEN_LENGTHS if o is GEN_LENGTH else o for o in SHARED) + (
        count("--batch", "batch_sizes", "A batch size; repeatable.", multiple=True),
        fraction("--threshold", "threshold", "Of the threshold scheduler (1.0: about one token per "
                 "step, a long decode)."),
        Option(("--stop-at-eos/--no-stop-at-eos",), "stop_at_eos", bool,
               "Stop a row after the block holding its end-of-text [stop]."),
        Option(("--variant",), "variants", str, "Also compare this configured cache (e.g. "
               "dual:prefix_look=1024); repeatable.", multiple=True, metavar="NAME[:KEY=VALUE,...]",
               registry="cache"),
        Option(("--new-caches/--no-new-caches",), "new_caches", bool,
               "Also compare d2, elastic, suffix and suffix:mode=dpad at their defaults [on]."),
        KV_CACHE_DTYPE,
    ),
    run, later("dllm_decode.eval.bench.report", "format_cache"),
    quick=dict(gen_lengths=(64,), batch_sizes=(1, 4), per_task=1, repeats=1, forward_repeats=1))
