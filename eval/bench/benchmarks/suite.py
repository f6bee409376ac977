"""The suite (`bench all`) and its sections, each runnable alone: schedulers, stack, loop, gap,
ar and compile (`dllm_decode.eval.bench.suite`, `.sections`)."""

from __future__ import annotations

from typing import Any

from dllm_decode.eval.bench.benchmarks.checks import subject
from dllm_decode.eval.bench.protocol import (GEN_LENGTH, SHARED, Benchmark, Option, Say, Settings, blame,
                                             fill, later)

DEFAULTS = ("Defaults: 8 prompts per task of 7 deterministic tasks, gen 256, block 32, batch 8, "
            "3 repeats (the scheduler table 1); --quick: 1 per task, gen 16, block 8, 1 repeat.")
QUICK = dict(gen_length=16, block_length=8, per_task=1, batch=4, batch_sizes=(1, 2), repeats=1,
             ar_samples=2, ar_new_tokens=8)
BEST = Option(("--best",), "best", str, "Build on this scheduler-table row (a scheduler name or "
              "preset:NAME) instead of running the scheduler table to pick it.", metavar="ROW")


def runner(sections: tuple[str, ...]) -> Any:
    def run(settings: Settings, say: Say) -> dict[str, Any]:
        from dllm_decode.eval.bench.sections import SuiteOptions, combo_named
        from dllm_decode.eval.bench.suite import run_suite

        options = fill(SuiteOptions, settings)
        best = settings.get("best")
        if best is not None:
            with blame("--best"):
                combo_named(best, options, None)
        return run_suite(subject(settings), options, sections, settings.get("threads", 1), best, say)
    return run


def section(name: str, help: str, *, sections: tuple[str, ...] | None = None, best: bool = False,
            options: tuple[Option, ...] = SHARED, defaults: str = DEFAULTS) -> Benchmark:
    return Benchmark(name, help, defaults, options + ((BEST,) if best else ()),
                     runner(sections or (name,)), later("dllm_decode.eval.bench.report", "format_suite"),
                     QUICK)


ALL = section("all", "The suite: schedulers, stack, loop, oracle gap and AR.", best=True,
              sections=("schedulers", "stack", "loop", "gap", "ar"))
SCHEDULERS = section("schedulers", "Every scheduler at its paper defaults and the tuned presets, no cache: NFE, "
                     "accuracy and speed against one token per step and the Learn2PD oracle.")
STACK = section("stack", "Prefix and dual caches and the EoTP filter on `threshold` and the best scheduler; "
                "the full stack against one token per step without cache.", best=True)
LOOP = section("loop", "Loop overhead (share of time outside model forwards) and tokens per second by "
               "batch size, for one token per step and for the full stack.", best=True,
               defaults=DEFAULTS + " Batch sizes 1, 4, 16 (--quick: 1, 2).")
GAP = section("gap", "Oracle gap: how many steps answer tokens stay correct before one token per step "
              "commits them, and the confidences a threshold rule would have needed.")
AR = section("ar", "Plain greedy AR against AR + speculative decoding with the shipped draft (embedded "
             "pair, batch 1; greedy verification, so the outputs must be identical).",
             options=tuple(GEN_LENGTH.but(dest="ar_new_tokens", help="New tokens per prompt.")
                           if o is GEN_LENGTH else o for o in SHARED),
             defaults="Defaults: the suite's first 14 prompts, 32 new tokens, 3 repeats; --quick: 2 "
                      "prompts, 8 new tokens, 1 repeat.")
COMPILE = section("compile", "One forward, eager against `torch.compile` (static shapes), for a full and a "
                  "dual-cache step at batch 1, and the compile time (minutes on CPU).",
                  defaults="Defaults: gen 256, block 32, 9 timed forwards each (--quick: gen 16, block 8, 5).")
BENCHMARKS = (ALL, SCHEDULERS, STACK, LOOP, GAP, AR, COMPILE)
