"""The tuner's protocol: splits, budget, a budgeted search through the eval harness, the choice, and
the held-out check.

Splits: `calibration + held_out` distinct test-split instances per task (the data seed's draw),
ordered by a salted hash of the prompt; the first `calibration` calibrate, the rest are held out,
so the two never share a prompt and a re-run draws the same ones.

Budget (`Budget.parse`): `within:b` (the default `within:1.0`) is a paired drop Δ = mean(r_i - a_i)
<= b points against one token per step on the same prompts; `at-least:x` is a mean accuracy >= x.
A point is accepted on the calibration split only when a one-sided Wilson bound at the chosen
confidence meets the budget (`Budget.accepts`), so the held-out check, a point estimate, rarely
fails; one prompt is 100/n points, and the least drop certifiable on n prompts is
`Budget.least_certifiable(n)`.

Search (`search`, every decode through `runner.evaluate`, resumable): per rule and task a walk
from the aggressive end of the grid, each probe successive halving with exact early stopping and a
stop once the rule is dominated by a cheaper accepted point; then one overall setting by branch
and bound over the rules' candidates. The reference's forwards are counted apart. The choice per
task is the cheapest accepted point (mean forwards per prompt), the reference itself when none is;
"overall" is the one point accepted on every task with the lowest mean cost. The held-out split
then scores every chosen point, the overall one, the best single `threshold` and the reference; it
is never used to choose.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllm_decode.cost import MAX_PROMPTS
from dllm_decode.eval.harness.grid import Setting
from dllm_decode.eval.harness.runner import Decoder, config_key_of, evaluate
from dllm_decode.eval.tasks.sources import TaskRun

STAGES = (0.125, 0.25, 0.5, 1.0)
CLEAR = 2.0
"""Standard errors by which a point must miss the budget to be dropped early."""


@dataclass(frozen=True)
class Budget:
    """`kind` "within" (paired drop <= `points`) or "at-least" (accuracy >= `points`); `z` the
    one-sided normal quantile of the acceptance's confidence bound (0: the point estimate).

    Acceptance on the calibration split is conservative: a point is accepted when a one-sided
    Wilson score bound (Wilson 1927) at `z` meets the budget, not merely its point estimate. For
    `within`, the bound is the Wilson upper bound on the rate of prompts the reference solves and
    the point does not (losses), less the Wilson lower bound on the reverse (gains); for `at-least`, the
    Wilson lower bound on the accuracy. A point with no loss on n prompts is then credited with a
    drop of 100 z^2 / (n + z^2) points (`least_certifiable`), so a budget below that keeps the
    reference: at small n the tuner says no setting is certified rather than pick one that loses
    on the held-out split. The held-out check (`meets`) is the plain point estimate.
    """

    kind: str
    points: float
    z: float = 0.0

    @classmethod
    def parse(cls, text: str, confidence: float = 0.5) -> Budget:
        kind, _, value = text.partition(":")
        try:
            points = float(value)
        except ValueError:
            points = float("nan")
        if kind not in ("within", "at-least") or not math.isfinite(points) or points < 0 \
                or (kind == "at-least" and points > 100):
            raise ValueError(f"budget must be within:POINTS or at-least:PERCENT (a percentage <= 100; "
                             f"e.g. within:1.0), got {text!r}")
        if not 0.5 <= confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1) (0.5: the point estimate), got {confidence:g}")
        return cls(kind, points, statistics.NormalDist().inv_cdf(confidence))

    def margin(self, scores: Sequence[float], reference: Sequence[float]) -> tuple[float, float]:
        """(how far the point estimate is inside the budget in points, negative when it misses;
        its standard error)."""
        if self.kind == "within":
            diffs = [100 * (r - a) for r, a in zip(reference, scores)]
            return self.points - _mean(diffs), _se(diffs)
        values = [100 * a for a in scores]
        return _mean(values) - self.points, _se(values)

    def bound(self, scores: Sequence[float], reference: Sequence[float]) -> float:
        """The conservative figure in points: the drop's upper bound (`within`) or the accuracy's
        lower bound (`at-least`), at `z`."""
        n = len(scores)
        if n == 0:
            return math.inf if self.kind == "within" else -math.inf
        if self.kind == "within":
            losses = sum(max(0.0, r - a) for r, a in zip(reference, scores))
            gains = sum(max(0.0, a - r) for r, a in zip(reference, scores))
            return 100 * (wilson(losses, n, self.z) - wilson(gains, n, -self.z))
        return 100 * wilson(sum(scores), n, -self.z)

    def accepts(self, scores: Sequence[float], reference: Sequence[float]) -> bool:
        """The calibration acceptance: the conservative bound meets the budget."""
        figure = self.bound(scores, reference)
        return figure <= self.points + 1e-9 if self.kind == "within" else figure >= self.points - 1e-9

    def meets(self, scores: Sequence[float], reference: Sequence[float]) -> bool:
        """The point estimate meets the budget (the held-out check)."""
        return self.margin(scores, reference)[0] >= -1e-9

    def clearly_fails(self, scores: Sequence[float], reference: Sequence[float]) -> bool:
        margin, se = self.margin(scores, reference)
        return margin < -CLEAR * se and margin < 0

    def cannot_meet(self, scores: Sequence[float], reference: Sequence[float]) -> bool:
        """True when the first len(scores) prompts already rule out acceptance on the whole split
        whatever the rest score (`reference` covers the whole split): an exact bound, no
        statistics. At best the rest lose nothing more and gain every prompt the reference
        misses (for `at-least`: all pass)."""
        k = len(scores)
        rest = reference[k:]
        best = list(scores) + ([1.0] * len(rest))
        return not self.accepts(best, reference)

    def least_certifiable(self, n: int) -> float:
        """The smallest drop in points (`within`) the acceptance can certify on n prompts: a
        point with no loss and no gain."""
        return 100 * wilson(0.0, n, self.z)

    def __str__(self) -> str:
        return f"{self.kind}:{self.points:g}"


def wilson(k: float, n: int, z: float) -> float:
    """The Wilson score bound on a rate from k successes of n: upper for z > 0, lower for z < 0,
    k / n at z = 0."""
    if z == 0:
        return k / n
    centre = k + z * z / 2
    spread = abs(z) * math.sqrt(max(0.0, k * (n - k) / n) + z * z / 4)
    return min(1.0, max(0.0, (centre + math.copysign(spread, z)) / (n + z * z)))


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
    if isinstance(calibration, bool) or not isinstance(calibration, int) or not 1 <= calibration <= MAX_PROMPTS:
        raise ValueError(f"calibration must be an integer in [1, {MAX_PROMPTS}], got {calibration!r}")
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
    """Evaluate settings x runs into `out` (resumable; data-parallel under torchrun, every rank
    taking its share of the batches) and record them in the ledger. Every rank gets rank 0's
    merged records, so all ranks take the same search decisions in step."""
    def run(settings: Sequence[Setting], runs: Sequence[TaskRun], ask: bool = True) -> None:
        if not settings or not runs:
            return
        records = evaluate(decoder, model, settings, runs, out, tokenizer=tokenizer,
                           batch_size=batch_size, progress=progress)
        ledger.add(shared(records), ask)
    return run


def shared(records: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Rank 0's records on every rank (JSON bytes broadcast over the process group; one process:
    as given)."""
    from dllm_decode.eval.harness import distributed

    rank, world = distributed.rank_and_world()
    if world == 1:
        return records or []
    import torch
    import torch.distributed as dist

    data = json.dumps(records).encode() if rank == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.long)
    dist.broadcast(size, 0)
    buffer = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if rank == 0
              else torch.empty(int(size.item()), dtype=torch.uint8))
    dist.broadcast(buffer, 0)
    return records if rank == 0 else json.loads(buffer.numpy().tobytes())


@dataclass
class Point:
    """One evaluated configuration on one task: calibration figures at the last stage run (full
    size, or where it was dropped); `meets` is the conservative acceptance, `bound` its figure."""

    setting: Setting
    task: str
    stage: float
    accuracy: float
    delta: float
    nfe: float
    meets: bool
    dropped: bool
    bound: float = float("nan")

    def row(self) -> dict[str, Any]:
        return {"setting": self.setting.to_dict(), "label": self.setting.label(), "params": self.setting.params(),
                "task": self.task, "stage": self.stage, "accuracy": self.accuracy, "delta": self.delta,
                "bound": self.bound, "nfe": self.nfe, "meets": self.meets, "dropped": self.dropped}


PASS, FAIL, DOMINATED = "pass", "fail", "dominated"


def search(run: Run, ledger: Ledger, chains: Sequence[list[Setting]], reference: Setting,
           cal: Sequence[TaskRun], budget: Budget) -> list[Point]:
    """The budgeted search over `chains` (each a rule's grid, conservative first); returns the
    last figures of every (point, task) evaluated.

    Every probe is successive halving over the task's calibration prompts (an eighth, a quarter,
    half, all; each stage reuses the earlier stages' samples), dropped at the first stage where it
    clearly fails (more than 2 standard errors of the paired difference) or can no longer be
    accepted whatever the remaining prompts score (`Budget.cannot_meet`, exact).

    Per task: per rule, a walk from the aggressive (cheapest) end of the grid back towards the
    conservative end, stopping at the first accepted point (accuracy is roughly monotone along
    the grid, so that is the rule's fastest accepted point; failing aggressive probes are cheap
    and usually stop at the first stage). The walk also stops, as dominated, once a probe's
    measured forwards reach the task's cheapest accepted point found by an earlier rule: forwards
    only grow towards the conservative end, so no later point of this rule can win the task.

    Overall: per rule, the most aggressive index accepted on every task walked (or not yet
    settled) is a candidate. Candidates are verified cheapest lower bound first (a task's bound is
    its full cost where known, else the cost of a more aggressive point of the same rule), task by
    task with the tasks where the candidate sits at its own boundary first, stepping back on a
    task that rejects it; a candidate is abandoned as soon as its bound reaches the cheapest
    verified overall setting. The reference's own forwards are the budget's, not the search's,
    and are counted apart.
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
                      _mean(nfe), budget.accepts(scores, ref), dropped, budget.bound(scores, ref))
        points[(setting, task)] = point
        return point

    def probe(setting: Setting, task: str, ceiling: float = math.inf) -> str:
        done = points.get((setting, task))
        if done is not None and (done.stage == STAGES[-1] or done.dropped):
            return PASS if done.meets and done.stage == STAGES[-1] else FAIL
        for stage in STAGES:
            if done is not None and stage <= done.stage:
                continue
            run([setting], [head(by_name[task], stage)], True)
            point = judge(setting, task, stage)
            if point.dropped:
                return FAIL
            if stage < STAGES[-1] and point.nfe >= ceiling:
                return DOMINATED
        return PASS if point.meets else FAIL

    cheapest: dict[str, float] = {}                    # per task: the cheapest accepted cost so far
    candidates = []
    for grid in chains:
        best: dict[str, int] = {}
        for task in sizes:
            index = len(grid) - 1                         # from the aggressive (cheap) end back
            while index >= 0:
                verdict = probe(grid[index], task, cheapest.get(task, math.inf))
                if verdict == PASS:
                    cheapest[task] = min(cheapest.get(task, math.inf), points[(grid[index], task)].nfe)
                if verdict != FAIL:
                    break
                index -= 1
            best[task] = index
        index = min(best.values())
        if index >= 0:
            candidates.append((_bound(points, grid, index, best), grid, index, best))
    verified = math.inf
    for _, grid, index, best in sorted(candidates, key=lambda c: c[0]):
        while index >= 0:
            order = sorted(sizes, key=lambda t: (best[t] != index, -_task_bound(points, grid, index, best, t)))
            rejected = False
            for task in order:
                if _bound(points, grid, index, best) >= verified:
                    break
                if probe(grid[index], task) != PASS:
                    rejected = True
                    break
            else:
                verified = min(verified, _bound(points, grid, index, best))
                break
            if not rejected:                              # its bound cannot beat a verified setting
                break
            index -= 1
    return list(points.values())


def _task_bound(points: dict[tuple[Setting, str], Point], grid: list[Setting], index: int, best: dict[str, int],
                task: str) -> float:
    """A lower bound on grid[index]'s mean forwards on `task`: its full cost where known, else the
    cost measured (at any stage) at the most conservative more aggressive point of the grid."""
    full = _full_nfe(points, grid[index], task)
    if full is not None:
        return full
    for j in range(index, len(grid)):
        point = points.get((grid[j], task))
        if point is not None:
            return point.nfe
    return 0.0


def _bound(points: dict[tuple[Setting, str], Point], grid: list[Setting], index: int, best: dict[str, int]) -> float:
    tasks = list(best)
    return _mean([_task_bound(points, grid, index, best, t) for t in tasks])


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
