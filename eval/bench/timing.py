"""The one timing helper of every benchmark: interleaved repeats and a forward timer.

Speed claims are ratios measured side by side in one run. `interleave` runs every
configuration (a label with its list of work items) `repeats` times; inside a repeat it visits
item 0 of every configuration, then item 1, ..., each time in an order rotated by
`repeat + item`, so load drifts on a shared machine hit every configuration alike. A
configuration's time is the median over repeats of its seconds summed over items, and a speedup
is the ratio of two such medians.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Timed(Generic[R]):
    """One timed job: its wall-clock seconds and what it returned."""

    seconds: float
    value: R


@dataclass(frozen=True)
class Runs(Generic[R]):
    """Every job of one configuration, `runs[repeat][item]`."""

    label: str
    runs: list[list[Timed[R]]]

    def per_repeat(self) -> list[float]:
        """Seconds summed over items, one figure per repeat."""
        return [sum(t.seconds for t in repeat) for repeat in self.runs]

    def seconds(self) -> float:
        """Median over repeats of the seconds summed over items."""
        return statistics.median(self.per_repeat())

    def values(self, repeat: int = 0) -> list[R]:
        """What the jobs of one repeat returned, item by item (repeat 0 by default: greedy
        decoding repeats exactly)."""
        return [t.value for t in self.runs[repeat]]


def speedup(base: Runs, other: Runs) -> float:
    """How many times faster `other` ran than `base`: the ratio of their medians."""
    return base.seconds() / other.seconds()


def rotation(count: int, repeat: int, item: int) -> list[int]:
    """The order in which `count` configurations run item `item` of repeat `repeat`."""
    shift = (repeat + item) % count
    return [(shift + k) % count for k in range(count)]


def interleave(plans: Sequence[tuple[str, Sequence[T]]], repeats: int,
               job: Callable[[str, int, T], Callable[[], R]],
               clock: Callable[[], float] = time.perf_counter) -> dict[str, Runs[R]]:
    """Run every plan's items `repeats` times, interleaved; returns label -> `Runs`.

    Args:
        plans: (label, items) per configuration; configurations may have different numbers of
            items (item i is visited by those that have one).
        repeats: interleaved repeats (>= 1).
        job: `job(label, index, item)` prepares one run, untimed (an oracle's reference decode,
            say), and returns the zero-argument callable that is timed.
        clock: seconds as a float (a fake clock in tests).
    Raises:
        ValueError: duplicate labels, no plans, or repeats < 1.
    """
    labels = [label for label, _ in plans]
    if not plans or len(set(labels)) != len(labels):
        raise ValueError(f"interleave needs plans with unique labels, got {labels}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    runs: dict[str, list[list[Timed[R]]]] = {label: [] for label in labels}
    for repeat in range(repeats):
        for label in labels:
            runs[label].append([])
        for index in range(max(len(items) for _, items in plans)):
            present = [plan for plan in plans if index < len(plan[1])]
            for k in rotation(len(present), repeat, index):
                label, items = present[k]
                call = job(label, index, items[index])
                started = clock()
                value = call()
                runs[label][-1].append(Timed(clock() - started, value))
    return {label: Runs(label, runs[label]) for label in labels}


def check_counts(record: Any, *names: str) -> None:
    """Raise ValueError naming the first of `record`'s count fields (repeats, prompts...) below 1."""
    for name in names:
        if getattr(record, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(record, name)}")


@contextlib.contextmanager
def forward_timer(model: Any, sync: Callable[[], None] | None = None) -> Iterator[list[float]]:
    """Time every forward pass of `model` while the context is open.

    `sync` (e.g. `torch.cuda.synchronize`) runs before and after each forward, so an
    asynchronous device's kernels are counted inside the forward they belong to.

    Yields a list `[seconds inside forward, forward calls]` that fills as the model runs (stays
    `[0.0, 0]` when `model` is None). The wrapper is an instance attribute (`nn.Module.__call__`
    looks `forward` up on the instance), so caches, the loop and drafters are timed without
    knowing about it; it is removed on exit.
    """
    spent = [0.0, 0]
    if model is None:
        yield spent
        return
    had_own = "forward" in vars(model)
    inner = model.forward

    def timed(*args: Any, **kwargs: Any) -> Any:
        if sync is not None:
            sync()
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            if sync is not None:
                sync()
            spent[0] += time.perf_counter() - started
            spent[1] += 1

    model.forward = timed
    try:
        yield spent
    finally:
        if had_own:
            model.forward = inner
        else:
            del model.forward
