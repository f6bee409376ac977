"""`bench spec`: AR speculative decoding, drafters and draft-length rules against plain AR greedy
(`dllm_decode.eval.bench.spec`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.benchmarks.checks import causal_named, diffusion_named
from dllm_decode.eval.bench.protocol import (MODEL, NEW_TOKENS, PER_TASK, REPEATS, THREADS, Benchmark,
                                             Option, Say, Settings, count, fill, later)


def run(settings: Settings, say: Say) -> dict[str, Any]:
    import torch

    from dllm_decode.eval.bench.spec import SpecOptions, run_spec
    from dllm_decode.eval.bench.subject import machine

    model = settings.get("model", "embedded")
    diffusion_named(model)
    causal_named(settings.get("target"), "--target")
    causal_named(settings.get("draft"), "--draft")
    options = fill(SpecOptions, settings, dllm=model)
    torch.set_num_threads(settings.get("threads", 1))
    return {"machine": machine(settings.get("threads", 1)), **run_spec(options, say)}


BENCHMARK = Benchmark(
    "spec",
    "AR speculative decoding: every drafter and draft-length scheduler against plain AR greedy, with "
    "the acceptance theory beside the measured speedup.",
    "Defaults: 2 prompts per task of every task, 48 new tokens, 3 repeats, both target runtimes, "
    "SmolLM2 when fetched (1 repeat); --quick: 1 per task, 8 new tokens, 1 repeat, compact target, "
    "no SmolLM2.",
    (MODEL.but(help="The diffusion model that drafts blocks (skipped when missing or its vocabulary "
                    "differs from the target's)."), THREADS, REPEATS, PER_TASK, NEW_TOKENS,
     Option(("--target",), "target", str, "The embedded suite's target [ar_target]."),
     Option(("--draft",), "draft", str, "The embedded suite's draft model [ar_draft]."),
     Option(("--target-runtime",), "target_runtimes", ("hf", "compact"),
            "Run the embedded suite with the target in this runtime; repeatable [both].", multiple=True),
     Option(("--smollm2/--no-smollm2",), "smollm2", bool,
            "Also run the SmolLM2 suite (needs `dllm-decode fetch smollm2`) [on]."),
     count("--smollm2-repeats", "smollm2_repeats"), count("--smollm2-tokens", "smollm2_tokens")),
    run, later("dllm_decode.eval.bench.report", "format_spec"),
    quick=dict(per_task=1, repeats=1, max_new_tokens=8, smollm2=False, target_runtimes=("compact",)))
