"""`bench tree`: chains, token trees, staged drafts, BiLD and dLLM self-speculation side by side
(`dllm_decode.eval.bench.spec_tree`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.benchmarks.checks import causal_named, diffusion_named
from dllm_decode.eval.bench.protocol import (NEW_TOKENS, PER_TASK, REPEATS, THREADS, Benchmark, Option, Say,
                                             Settings, blame, count, fill, later)


def run(settings: Settings, say: Say) -> dict[str, Any]:
    from transformers.utils import logging

    from dllm_decode.eval.bench.spec_tree import TreeOptions, parse_rollbacks, run as run_tree

    causal_named(settings.get("target"), "--target", "ar_target")
    causal_named(settings.get("draft"), "--draft", "ar_draft")
    diffusion_named(settings.get("dllm", "embedded"), "--dllm")
    with blame("--bild-rollbacks"):
        rollbacks = {"bild_rollbacks": tuple(parse_rollbacks(settings["bild_rollbacks"]))} \
            if "bild_rollbacks" in settings else {}
    options = fill(TreeOptions, settings, **rollbacks)
    logging.disable_progress_bar()
    return run_tree(options, say)


BENCHMARK = Benchmark(
    "tree",
    "Chains against token trees, staged drafts, BiLD (fallback, rollback) and dLLM self-speculation, "
    "each against its own baseline in one interleaved run: tokens per target call, wall and CPU-time "
    "speedups, identical-output rate, accuracy.",
    "Defaults: 4 AR prompts per task of every task, 48 new tokens, 3 repeats, both target runtimes; "
    "tree 4/16 with path floor 0.05; BiLD fallback 0.6, rollbacks none,1,2,3,5; dLLM self-speculation "
    "on 2 prompts per task, 2 repeats, K=8; --quick: 1 AR prompt per task, 8 new tokens, 1 repeat, "
    "the compact target, rollbacks none,2, self-speculation on 1 prompt per task, 1 repeat, K=4.",
    (Option(("--target",), "target", str, "The AR target [ar_target]."),
     Option(("--draft",), "draft", str, "The AR draft [ar_draft]."),
     Option(("--dllm",), "dllm", str, "The dLLM of the self-speculation part [embedded]."),
     THREADS, REPEATS, PER_TASK.but(help="AR prompts per task."),
     NEW_TOKENS.but(flags=("--gen-length", "--max-new-tokens")),
     Option(("--target-runtime",), "runtimes", ("hf", "compact"), "Target runtime; repeatable [both].",
            multiple=True),
     Option(("--tree-branch",), "tree_branch", int, "Children per expanded node [4].", low=1, high=16),
     count("--tree-budget", "tree_budget", "Most nodes verified per round [16]."),
     Option(("--tree-min-prob",), "tree_min_prob", float, "Path probability floor off the spine [0.05].",
            low=0, high=1),
     Option(("--bild-fallback",), "bild_fallback", float, "BiLD's alpha_fb [0.6].", low=0, high=1),
     Option(("--bild-rollbacks",), "bild_rollbacks", str,
            "Comma list of alpha_rb in nats, `none` = exact [none,1,2,3,5]."),
     Option(("--self-per-task",), "self_per_task", int,
            "dLLM prompts per task (0: skip the self-speculation part) [2].", low=0),
     count("--self-repeats", "self_repeats", "[2]"), count("--draft-steps", "draft_steps", "[8]"),
     count("--self-branch", "self_branch", "[2]")),
    run, later("dllm_decode.eval.bench.spec_tree", "format_tree"),
    quick=dict(per_task=1, repeats=1, max_new_tokens=8, runtimes=("compact",), bild_rollbacks="none,2",
               self_per_task=1, self_repeats=1, draft_steps=4))
