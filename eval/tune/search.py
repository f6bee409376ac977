"""The tuner's protocol: splits, budget, a budgeted search through the eval harness, the choice, and
the held-out check.

Splits: `calibration + held_out` distinct test-split instances per task (the data seed's draw),
ordered by a salted hash of the prompt; the first `calibration` calibrate, the rest are held out,
so the two never share a prompt and a re-run draws the same ones.

Budget (`Budget.parse`): `within:b` (the default `within:1.0`) is a paired drop Δ = mean(r_i - a_i)
<= b points against one token per step on the same prompts; `at-least:x` is a mean accuracy >= x.
One prompt is 100/n points: `within:1` needs n >= 100 per task to mean anything.

Search (every decode through `runner.evaluate`, resumable): per rule, cache and task, a walk from
the aggressive end of the grid (accuracy is roughly monotone in the knob, and forwards fall along
it) to the first point that meets the budget; each probe is successive halving: a quarter of the
calibration prompts, then half, then all, stopping where it clearly fails (by more than 2 standard
errors of the paired difference) or can no longer meet the budget whatever the rest score. Then the
rules' candidates for one overall setting, each its most aggressive point passing on every task,
run in full on every task, cheapest lower bound first, while they can still beat the best found. The reference's forwards are the budget's own, needed by any search, and are
counted apart. The choice per task is the cheapest point (mean forwards per prompt) whose full
calibration Δ meets the budget, the reference itself when none does; "overall" is the one point
that meets it on every task with the lowest mean cost over tasks. The held-out split then scores
every chosen point, the overall one, the best single `threshold` and the reference; it is never
used to choose.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllm_decode.eval.harness.grid import Setting
from dllm_decode.eval.harness.runner import Decoder, config_key_of, evaluate
from dllm_decode.eval.tasks.sources import TaskRun

STAGES = (0.25, 0.5, 1.0)
CLEAR = 2.0
"""Standard errors by which a point must miss the budget to be dropped early."""


@dataclass(frozen=True)
class Budget:
    """`kind` "within" (paired drop <= `points`) or "at-least" (accuracy >= `points`)."""

    kind: str
    points: float

    @classmethod
    def parse(cls, text: str) -> Budget:
        kind, _, value = text.partition(":")
        try:
            points = float(value)
        except ValueError:
            points = float("nan")
        if kind not in ("within", "at-least") or not math.isfinite(points) or points < 0:
            raise ValueError(f"budget must be within:POINTS or at-least:PERCENT (e.g. within:1.0), got {text!r}")
        return cls(kind, points)

    def margin(self, scores: Sequence[float], reference: Sequence[float]) -> tuple[float, float]:
        """(how far the point is inside the budget in points, negative when it misses; its
        standard error)."""
        if self.kind == "within":
            diffs = [100 * (r - a) for r, a in zip(reference, scores)]
            return self.points - _mean(diffs), _se(diffs)
        values = [100 * a for a in scores]
        return _mean(values) - self.points, _se(values)

    def meets(self, scores: Sequence[float], reference: Sequence[float]) -> bool:
        return self.margin(scores, reference)[0] >= -1e-9

    def clearly_fails(self, scores: Sequence[float], reference: Sequence[float]) -> bool:
        margin, se = self.margin(scores, reference)
        return margin < -CLEAR * se and margin < 0

    def cannot_meet(self, scores: Sequence[float], reference: Sequence[float]) -> bool:
        """True when the first len(scores) prompts already miss the budget on the whole split
        whatever the rest score (`reference` covers the whole split): an exact bound, no
        statistics. The rest can at best score 1 each, so a paired difference r - a there is
        at least r - 1."""
        n, k = len(reference), len(scores)
        if self.kind == "within":
            seen = sum(100 * (r - a) for r, a in zip(reference, scores))
            best_rest = sum(100 * (r - 1) for r in reference[k:])
            return (seen + best_rest) / n > self.points + 1e-9
        return 100 * (sum(scores) + (n - k)) / n < self.points - 1e-9

    def __str__(self) -> str:
        return f"{self.kind}:{self.points:g}"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _se(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n)


def split(runs: Sequence[TaskRun], calibration: int, salt: str) -> tuple[list[TaskRun], list[TaskRun]]:
    """Each task's examples ordered by a salted prompt hash: the first `calibration` calibrate,
    the rest are held out."""
    cal, held = [], []
    for run in runs:
        if len(run.examples) <= calibration:
            raise ValueError(f"{run.name}: {len(run.examples)} examples drawn, need more than "
                             f"--calibration {calibration} to hold some out")
        ordered = sorted(run.examples, key=lambda e: hashlib.sha256(f"{salt}\x00{run.name}\x00{e.prompt}".encode()).digest())
        cal.append(TaskRun(run.name, tuple(ordered[:calibration]), run.score))
        held.append(TaskRun(run.name, tuple(ordered[calibration:]), run.score))
    return cal, held


def head(run: TaskRun, fraction: float) -> TaskRun:
    """The first `fraction` of a task's prompts (at least one), the same prefix at every stage so
    each stage reuses the earlier ones' samples."""
    return TaskRun(run.name, run.examples[:max(1, math.ceil(len(run.examples) * fraction))], run.score)


@dataclass
class Ledger:
    """Every sample decoded: (config key, task) -> per-prompt scores and forwards, plus which keys
    the search itself asked for (its forward count)."""

    model: str
    scores: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    nfe: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    asked: set[tuple[str, str, int]] = field(default_factory=set)
    forwards: dict[tuple[str, str, int], int] = field(default_factory=dict)

    def add(self, records: list[dict[str, Any]], ask: bool) -> None:
        for record in records:
            key = (record["config_key"], record["task"])
            index = record["index"]
            scores = self.scores.setdefault(key, [])
            nfe = self.nfe.setdefault(key, [])
            while len(scores) <= index:
                scores.append(float("nan"))
                nfe.append(0)
            scores[index], nfe[index] = record["score"], record["nfe"]
            self.forwards[(*key, index)] = record["nfe"]
            if ask:
                self.asked.add((*key, index))

    def of(self, setting: Setting, task: str, n: int) -> tuple[list[float], list[int]]:
        key = (config_key_of(setting, self.model), task)
        return self.scores[key][:n], self.nfe[key][:n]

    def search_forwards(self) -> int:
        return sum(self.forwards[k] for k in self.asked)


Run = Callable[[Sequence[Setting], Sequence[TaskRun], bool], None]


def runner(decoder: Decoder, model: str, out: Path, ledger: Ledger, tokenizer: Any, batch_size: int,
           progress: bool) -> Run:
    """Evaluate settings x runs into `out` (resumable) and record them in the ledger."""
    def run(settings: Sequence[Setting], runs: Sequence[TaskRun], ask: bool = True) -> None:
        if not settings or not runs:
            return
        records = evaluate(decoder, model, settings, runs, out, tokenizer=tokenizer,
                           batch_size=batch_size, progress=progress)
        if records is None:
            raise RuntimeError("tune runs on one process (rank 0); start it without torchrun")
        ledger.add(records, ask)
    return run


@dataclass
class Point:
    """One evaluated configuration on one task: calibration figures at full size, or why it was
    dropped."""

    setting: Setting
    task: str
    stage: float
    accuracy: float
    delta: float
    nfe: float
    meets: bool
    dropped: bool

    def row(self) -> dict[str, Any]:
        return {"setting": self.setting.to_dict(), "label": self.setting.label(), "params": self.setting.params(),
                "task": self.task, "stage": self.stage, "accuracy": self.accuracy, "delta": self.delta,
                "nfe": self.nfe, "meets": self.meets, "dropped": self.dropped}


def search(run: Run, ledger: Ledger, chains: Sequence[list[Setting]], reference: Setting,
           cal: Sequence[TaskRun], budget: Budget) -> list[Point]:
    """The budgeted search over `chains` (each a rule's grid, conservative first); returns the
    last figures of every (point, task) evaluated.

    Per rule and task, a walk from the aggressive (cheapest) end of the grid back towards the
    conservative end, stopping at the first point that meets the budget: accuracy is roughly
    monotone along the grid, so that is the fastest passing point, and every point tried before
    it fails, usually clearly on a quarter of the prompts, while forwards grow along the walk
    (a bisection would verify expensive conservative points in full). Each probe is successive
    halving: a quarter of the task's calibration prompts, then half, then all, stopping at the
    first stage where it clearly fails, or where it cannot meet the budget on the whole split
    whatever the remaining prompts score (`Budget.cannot_meet`, exact). Then, per rule, the
    most aggressive index that met the budget on every task is a candidate for the one overall
    setting; candidates run on every task's full split (stepping back while one misses
    somewhere) cheapest lower bound first, until the next bound cannot beat the cheapest overall
    setting found (the bound takes, for a task it has not run on, the cost of the task's own,
    more aggressive, passing point: forwards do not fall towards the conservative end). The
    reference's own forwards are the budget's, not the search's, and are counted apart.
    """
    run([reference], cal, False)
    sizes = {r.name: len(r.examples) for r in cal}
    by_name = {r.name: r for r in cal}
    ref_scores = {t: ledger.of(reference, t, sizes[t])[0] for t in sizes}
    points: dict[tuple[Setting, str], Point] = {}

    def judge(setting: Setting, task: str, stage: float) -> Point:
        n = len(head(by_name[task], stage).examples)
        scores, nfe = ledger.of(setting, task, n)
        ref = ref_scores[task][:n]
        dropped = budget.clearly_fails(scores, ref) or budget.cannot_meet(scores, ref_scores[task])
        point = Point(setting, task, stage, 100 * _mean(scores), 100 * _mean([r - a for r, a in zip(ref, scores)]),
                      _mean(nfe), budget.meets(scores, ref), dropped)
        points[(setting, task)] = point
        return point

    def passes(setting: Setting, task: str) -> bool:
        done = points.get((setting, task))
        if done is not None and (done.stage == STAGES[-1] or done.dropped):
            return done.meets and done.stage == STAGES[-1]
        for stage in STAGES:
            run([setting], [head(by_name[task], stage)], True)
            point = judge(setting, task, stage)
            if point.dropped:
                return False
        return point.meets

    candidates = []
    for grid in chains:
        best: dict[str, int] = {}
        for task in sizes:
            index = len(grid) - 1                         # from the aggressive (cheap) end back
            while index >= 0 and not passes(grid[index], task):
                index -= 1
            best[task] = index
        index = min(best.values())
        if index >= 0:
            # a lower bound on its mean cost: where it has not run in full, the task's own passing
            # point (more aggressive, so no dearer along the grid) stands in
            bound = _mean([_full_nfe(points, grid[index], task) or _full_nfe(points, grid[best[task]], task) or 0.0
                           for task in sizes])
            candidates.append((bound, grid, index))
    verified = float("inf")
    for bound, grid, index in sorted(candidates, key=lambda c: c[0]):
        if bound >= verified:                             # cannot beat an overall setting found
            break
        while index >= 0 and not all(passes(grid[index], task) for task in sizes):
            index -= 1
        if index >= 0:
            verified = min(verified, _mean([_full_nfe(points, grid[index], task) or 0.0 for task in sizes]))
    return list(points.values())


def _full_nfe(points: dict[tuple[Setting, str], Point], setting: Setting, task: str) -> float | None:
    point = points.get((setting, task))
    return point.nfe if point is not None and point.stage == STAGES[-1] else None


def choose(points: Sequence[Point], tasks: Sequence[str]) -> tuple[dict[str, Point | None], Setting | None]:
    """Per task the cheapest point meeting the budget on its full calibration split (None: none
    does, keep the reference); overall the one setting meeting it on every task with the lowest
    mean cost (None if there is none). Ties go to the earlier (more conservative) point."""
    full = [p for p in points if p.stage == STAGES[-1] and p.meets]
    per_task: dict[str, Point | None] = {}
    for task in tasks:
        mine = [p for p in full if p.task == task]
        per_task[task] = min(mine, key=lambda p: p.nfe) if mine else None
    by_setting: dict[Setting, list[Point]] = {}
    for p in full:
        by_setting.setdefault(p.setting, []).append(p)
    everywhere = [(sum(p.nfe for p in ps) / len(ps), s) for s, ps in by_setting.items() if len(ps) == len(tasks)]
    overall = min(everywhere, key=lambda pair: pair[0])[1] if everywhere else None
    return per_task, overall


def paired(scores: Sequence[float], reference: Sequence[float]) -> tuple[float, float]:
    """Paired drop in points (reference - point) and its 95% half-width (normal approximation)."""
    diffs = [100 * (r - a) for r, a in zip(reference, scores)]
    return _mean(diffs), 1.96 * _se(diffs)
