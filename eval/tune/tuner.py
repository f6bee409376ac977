"""`tune`: the whole protocol end to end (search, choice, held-out check, exhaustive comparison)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllm_decode.eval.harness.grid import Setting
from dllm_decode.eval.harness.runner import Decoder
from dllm_decode.eval.tasks.sources import TaskRun
from dllm_decode.eval.tune.search import (STAGES, Budget, Ledger, Point, choose, paired, runner, search,
                                          split)
from dllm_decode.eval.tune.space import chain, reference, runnable, self_chain


@dataclass
class Outcome:
    """What `tune` found: the chosen settings, every evaluated point, held-out figures per
    (name, task), and the forward counts."""

    budget: Budget
    tasks: list[str]
    sizes: dict[str, tuple[int, int]]
    points: list[Point]
    per_task: dict[str, Point | None]
    overall: Setting | None
    best_threshold: Setting | None
    reference: Setting
    held_out: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    search_forwards: int = 0
    reference_forwards: int = 0
    sweep_forwards: int | None = None
    sweep_best: dict[str, Any] | None = None


def tune(decoder: Decoder, model: str, runs: Sequence[TaskRun], *, rules: Sequence[str], caches: Sequence[str],
         budget: Budget, calibration: int, salt: str, gen_length: int | None, block_length: int | None,
         out: Path, tokenizer: Any = None, batch_size: int = 8, progress: bool = False,
         exhaustive: bool = False, log: Callable[[str], None] | None = None,
         self_decoders: Sequence[str] = ()) -> Outcome:
    """Search `rules` x their grids x `caches` on the calibration split and check the choice on
    the held-out split. `exhaustive` also runs the full grid on the full calibration split (in the
    same resumable store) to count its forwards and find the best single global setting. `log`
    (a line at a time) hears what stage the run is in, so a long run is never silent.
    `self_decoders` (`space.SELF_BASE` names) join the search, each along its base rule's grid."""
    say = log or (lambda line: None)
    canvas = getattr(getattr(decoder, "model", None), "canvas_kind", "mask")   # a noise canvas: the rules that run on it
    rules, skipped = runnable(rules, canvas)
    if skipped:
        say(f"tune: skipped {', '.join(skipped)}: they do not run on a {canvas} canvas")
    cal, held = split(runs, calibration, salt)
    say(f"tune: searching {len(rules)} rule(s) x {len(caches)} cache(s) and {len(self_decoders)} self-decoder(s) on {sum(len(c.examples) for c in cal)} "
        f"calibration prompts over {len(cal)} task(s)")
    tasks = [r.name for r in cal]
    ledger = Ledger(model)
    run = runner(decoder, model, out / "calibration", ledger, tokenizer, batch_size, progress)
    ref = reference(gen_length, block_length, canvas)
    grid = getattr(getattr(decoder, "model", None), "block_size", None)   # a block-diffusion model's
    chains = [chain(rule, cache, gen_length, block_length, grid) for rule in rules for cache in caches]
    chains += [self_chain(name, gen_length, block_length) for name in self_decoders]
    points = search(run, ledger, chains, ref, cal, budget)
    per_task, overall = choose(points, tasks)
    threshold_points = [p for p in points if p.setting.scheduler == "threshold" and p.setting.self_decoder == "none"]
    _, best_threshold = choose(threshold_points, tasks)
    reference_forwards = sum(sum(ledger.of(ref, t, len(c.examples))[1]) for t, c in zip(tasks, cal))
    outcome = Outcome(budget, tasks, {r.name: (len(c.examples), len(r.examples)) for c, r in zip(cal, held)},
                      points, per_task, overall, best_threshold, ref, search_forwards=ledger.search_forwards(),
                      reference_forwards=reference_forwards)
    say(f"tune: search done ({len(points)} points, {outcome.search_forwards} forwards)")
    if exhaustive:
        say("tune: exhaustive sweep of the same grid")
        every = [s for grid in chains for s in grid]
        run(every, cal, False)
        total = sum(sum(ledger.of(s, t, len(c.examples))[1]) for s in every for t, c in zip(tasks, cal))
        outcome.sweep_forwards = total
        full = [Point(s, t, STAGES[-1], 0.0, 0.0, sum(n) / len(n), budget.accepts(sc, ledger.of(ref, t, len(sc))[0]), False)
                for s in every for t, c in zip(tasks, cal)
                for sc, n in [ledger.of(s, t, len(c.examples))]]
        _, sweep_overall = choose(full, tasks)
        _, outcome.best_threshold = choose([p for p in full if p.setting.scheduler == "threshold"
                                            and p.setting.self_decoder == "none"], tasks)
        if sweep_overall is not None:
            cost = [p.nfe for p in full if p.setting == sweep_overall]
            outcome.sweep_best = {"setting": sweep_overall.label() + " " + str(sweep_overall.params()),
                                  "mean_nfe": sum(cost) / len(cost)}
    held_ledger = Ledger(model)
    held_run = runner(decoder, model, out / "held_out", held_ledger, tokenizer, batch_size, progress)
    named: dict[str, tuple[Setting, list[str]]] = {"reference": (ref, tasks)}
    for task, point in per_task.items():
        if point is not None:
            named[f"task:{task}"] = (point.setting, [task])
    if overall is not None:
        named["overall"] = (overall, tasks)
    if outcome.best_threshold is not None:        # the sweep's, when --exhaustive replaced it
        named["best_threshold"] = (outcome.best_threshold, tasks)
    by_name = {r.name: r for r in held}
    say(f"tune: checking {len(named)} choice(s) on {sum(len(r.examples) for r in held)} held-out prompts")
    for name, (setting, its_tasks) in named.items():
        held_run([setting], [by_name[t] for t in its_tasks], False)
    for name, (setting, its_tasks) in named.items():
        figures = {}
        for task in its_tasks:
            n = len(by_name[task].examples)
            scores, nfe = held_ledger.of(setting, task, n)
            ref_scores, ref_nfe = held_ledger.of(ref, task, n)
            drop, half = paired(scores, ref_scores)
            figures[task] = {"n": n, "accuracy": 100 * sum(scores) / n, "delta": drop, "delta_ci95": half,
                             "nfe": sum(nfe) / n, "speedup": (sum(ref_nfe) / max(1, sum(nfe))),
                             "meets": budget.meets(scores, ref_scores)}
        outcome.held_out[name] = figures
    return outcome
