"""The theory curve drawn beside a measured one: the ideal model's accuracy for the setting a
sample was decoded with, and which kind of number it is (ParallelBench, arXiv 2510.04767, §4.2).

* `closed form`: Eq. 5 for Shuffle, and the Replace Random formulas of `formulas.py` for the
  ranking the scheduler uses: fixed-step rules (`low_confidence`, `random`, `margin`, `entropy`)
  with the partition asked of the rule itself, greedy or at temperature 1; greedy threshold
  rules, and Shuffle under a threshold at any temperature (every candidate's confidence is 1/m).
* `exact enumeration`: everything else `exact.EXACT_RULES` covers (sampled threshold, factor,
  EB, any temperature), computed by `exact.exact_outcome`.

Both assume the eval decoder's small logit noise (exact ties broken at random). A setting whose
rule compares a confidence at (within 1% of) its bar, e.g. threshold 0.5 on Shuffle (every
confidence 1/2 with two items left) or factor 1 at n = 4 (3/4 against 1 - 1/4), is decided by
that noise; it gets no point (`exact.KnifeEdge`) rather than a number the decoder will miss.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dllm_decode.eval.theory.exact import EXACT_RULES, KnifeEdge, exact_outcome, fixed_partition
from dllm_decode.eval.theory.formulas import THEORY_TASKS, ideal_accuracy, threshold_partition
from dllm_decode.interfaces import Scheduler
from dllm_decode.registry import component, name_of

CLOSED_FORM = "closed form"
EXACT = "exact enumeration"
FIXED_STEP_RANKING = {"low_confidence": True, "random": False, "margin": False, "entropy": False}
"""Fixed-step rules -> whether the committed positions are the most confident draws. Random
ranks by its own draws; margin and entropy score every position of these tasks alike (the
marginals are identical), so their order is independent of what was drawn."""


@dataclass(frozen=True)
class TheoryPoint:
    """The ideal model's expected point: answer tokens per forward pass (E[n / NFE]), accuracy
    (0-1) and the kind of number (`CLOSED_FORM` or `EXACT`)."""

    tokens_per_step: float
    accuracy: float
    kind: str


@functools.lru_cache(maxsize=4096)
def ideal_point(task: str, n: int, scheduler: Scheduler, temperature: float) -> TheoryPoint | None:
    """The ideal model's point for `task` with n items decoded in one block of n positions; None
    for a task or scheduler without one, or on a knife edge. Accuracy counts any valid answer of
    the data model (Shuffle: the identity too)."""
    name = name_of(scheduler)
    if task not in THEORY_TASKS or name not in EXACT_RULES or n < 1:
        return None
    sampled = temperature > 0
    if name in FIXED_STEP_RANKING and temperature in (0.0, 1.0):     # counts ignore the values
        partition = fixed_partition(scheduler, n)
    else:
        try:                               # also the knife-edge check of the closed forms below
            outcome = exact_outcome(task, n, scheduler, temperature)
        except KnifeEdge:
            return None
        if not (name == "threshold" and (task == "shuffle" or not sampled)):
            return TheoryPoint(outcome.tokens_per_step, outcome.accuracy, EXACT)
        partition = threshold_partition(task, n, scheduler.threshold)
    accuracy = ideal_accuracy(task, partition, sampled, FIXED_STEP_RANKING.get(name, True))
    return TheoryPoint(n / len(partition), accuracy, CLOSED_FORM)


def record_point(record: Mapping[str, Any]) -> TheoryPoint | None:
    """The theory point of one evaluation record (`dllm_decode.eval.harness.runner`), scored as
    the task scores it, or None: the task must be Shuffle or Replace Random, the canvas exactly
    its n answer items in one block, without a cache or filters, the scheduler one of
    `exact.EXACT_RULES`. Shuffle's scorers (ours and ParallelBench's) reject the identity; a
    decoded permutation is uniform by symmetry, so that is 1/n! of the valid ones."""
    task = record["task"].removeprefix("released/")
    n, gen = record.get("n"), record["gen_length"]
    config = record["config"]
    if (task not in THEORY_TASKS or n is None or gen != n or record["block_length"] != gen
            or (config.get("cache") or {}).get("name", "none") != "none" or config.get("filters")):
        return None
    spec = dict(config["scheduler"])
    k = spec.pop("tokens_per_step", None)
    if k is not None:
        spec["steps_per_block"] = math.ceil(gen / int(k))
    if spec.get("name") not in EXACT_RULES:
        return None
    point = ideal_point(task, n, component("scheduler", spec), float(config["temperature"]))
    if point is not None and task == "shuffle":
        point = TheoryPoint(point.tokens_per_step, point.accuracy * (1 - 1 / math.factorial(n)),
                            point.kind)
    return point
