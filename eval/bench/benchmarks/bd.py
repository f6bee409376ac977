"""`bench bd`: block diffusion against its AR parent and the LLaDA-style dLLM
(`dllm_decode.eval.bench.blockdiff`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.protocol import (GEN_LENGTH, GEN_LENGTHS, MODEL, SHARED, Benchmark, Option, Say,
                                             Settings, blame, fill, fraction, later)


def run(settings: Settings, say: Say) -> dict[str, Any]:
    import torch

    from dllm_decode.eval.bench.blockdiff import BlockDiffOptions, load_models, run_blockdiff
    from dllm_decode.eval.bench.subject import machine

    options = fill(BlockDiffOptions, settings, bd=settings.get("model", "embedded-bd"))
    torch.set_num_threads(settings.get("threads", 1))
    with blame("--model"):
        models = load_models(options)
    return {"machine": machine(settings.get("threads", 1)), **run_blockdiff(options, models, say)}


BENCHMARK = Benchmark(
    "bd",
    "Block diffusion against its AR parent and the LLaDA-style dLLM, batch 1, one interleaved run: "
    "accuracy, forwards per answer token, seconds per sample, speedup over AR.",
    "Defaults: 4 prompts per task of every task (48), gen 256 and 32 (native), threshold 0.9, 3 "
    "repeats; --quick: 1 per task, gen 32, 1 repeat.",
    tuple(MODEL.but(help="The block-diffusion model.", default="embedded-bd") if o is MODEL
          else GEN_LENGTHS if o is GEN_LENGTH else o for o in SHARED) + (
        Option(("--ar",), "ar", str, "Its AR parent, run greedy in the compact runtime [ar_target]."),
        Option(("--dllm",), "dllm", str, "The LLaDA-style dLLM compared beside them [embedded]."),
        fraction("--threshold", "threshold", "The threshold rule's confidence [0.9]."),
    ),
    run, later("dllm_decode.eval.bench.blockdiff", "format_blockdiff"),
    quick=dict(gen_lengths=(32,), per_task=1, repeats=1))
