"""The benchmark suite: the sections `dllm-decode bench all` runs, in dependency order.

`schedulers` picks the best scheduler (`sections.best_of`), on which `stack` and `loop` build;
given a `best` label they skip the scheduler table. `gap`, `ar` and `compile` stand alone. The
report is JSON-ready; `report.format_suite` prints it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from dllm_decode.eval.bench.sections import SuiteOptions
from dllm_decode.eval.bench.subject import Subject, machine, samples_for

SECTIONS = ("schedulers", "stack", "loop", "gap", "ar", "compile")
ALL = ("schedulers", "stack", "loop", "gap", "ar")
"""What `bench all` runs (compiling takes minutes on CPU: `bench compile` on its own)."""


def run_suite(subject: Subject, options: SuiteOptions, sections: Sequence[str], threads: int = 1,
              best: str | None = None, say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run `sections` (some of `SECTIONS`) on `subject`; returns the report.

    Args:
        options: lengths, counts and repeats.
        best: the scheduler-table row `stack` and `loop` build on (a scheduler name or
            `preset:NAME`); None: the `schedulers` section runs and picks it.
    Raises:
        ValueError: an unknown section or `best` row.
    """
    from dllm_decode.eval.bench import forward, sections as s
    from dllm_decode.eval.bench.measure import decode_once
    from dllm_decode.eval.bench.spec import section_ar
    from dllm_decode.schedulers import ThresholdScheduler

    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown section(s) {sorted(unknown)}; choose from {list(SECTIONS)}")
    best_combo = s.combo_named(best, options, subject.tokenizer) if best is not None else None
    samples = samples_for(subject, options.per_task, seed=options.seed)
    out: dict[str, Any] = {"machine": machine(threads), "model": subject.label,
                           "options": {**options.__dict__, "batch_sizes": list(options.batch_sizes)},
                           "samples": len(samples), "tasks": sorted({x.task for x in samples})}
    decode_once(subject.model, [samples[0].prompt], options.config(ThresholdScheduler()), subject.tokenizer)  # warm-up
    started = time.perf_counter()

    def done(name: str) -> None:
        say(f"{name} done ({time.perf_counter() - started:.0f}s)")

    say(f"model: {subject.label}; {len(samples)} samples")
    needs_best = {"stack", "loop"} & set(sections)
    if "schedulers" in sections or (needs_best and best_combo is None):
        out["schedulers"] = s.section_schedulers(subject, samples, options)
        done(f"schedulers (best: {out['schedulers']['best']})")
        if best_combo is None:
            best_combo = s.combo_named(out["schedulers"]["best"], options, subject.tokenizer)
    if "stack" in sections:
        out["stack"] = s.section_stack(subject, samples, options, best_combo)
        done("stack")
    if "loop" in sections:
        out["loop"] = s.section_loop(subject, samples, options, s.full_stack(best_combo, options))
        done("loop")
    if "gap" in sections:
        out["oracle_gap"] = s.section_gap(subject, samples, options)
        done("gap")
    if "ar" in sections:
        out["ar"] = section_ar(subject, samples, options)
        done("ar")
    if "compile" in sections:
        out["compile"] = forward.compile_speedup(subject.model, samples[0].prompt, subject.tokenizer,
                                                 options.gen_length, options.block_length,
                                                 max(5, 3 * options.repeats))
        done("compile")
    out["seconds_total"] = time.perf_counter() - started
    return out
