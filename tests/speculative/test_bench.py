"""`bench spec`: the theory columns, and the summary read from the right runs on a tiny target
(a fake clock that ticks once per target forward makes every speedup a ratio of forwards)."""

from __future__ import annotations

import math

import pytest

from dllm_decode.eval.bench.spec import (SpecCombo, measure, summarize, theory_speedup, theory_tokens,
                                         tokens_per_call_by_task)
from dllm_decode.schedulers import LowConfidenceScheduler
from dllm_decode.speculative import LookupDrafter, ModelDrafter


@pytest.mark.parametrize("alpha,drafted,expected", [
    (0.0, [4], 1.0),                          # every draft rejected: one token per call
    (1.0, [4], 5.0),                          # every draft accepted: g + 1
    (0.5, [2], 1.75),                         # 1 + a + a^2
    (0.8, [0, 3], (1.0 + (1 - 0.8 ** 4) / 0.2) / 2),
])
def test_theory_tokens(alpha, drafted, expected):
    assert math.isclose(theory_tokens(alpha, drafted), expected)


def test_theory_speedup():
    assert math.isclose(theory_speedup(1.75, 2, 0.0), 1.75)         # free drafts: tokens per call
    assert math.isclose(theory_speedup(4.0, 3, 1 / 3), 2.0)         # 4 tokens for 2 target steps
    assert theory_speedup(theory_tokens(0.2, [4]), 4, 0.5) < 1.0   # speedup needs alpha > c


class TargetClock:
    """One second per forward of the model it wraps."""

    def __init__(self, model):
        self.now = 0.0
        inner = model.forward

        def forward(*args, **kwargs):
            self.now += 1.0
            return inner(*args, **kwargs)

        model.forward = forward
        self.model = model

    def __call__(self) -> float:
        return self.now

    def release(self) -> None:
        del self.model.forward


@pytest.fixture
def ticking_target(target):
    clock = TargetClock(target)
    yield target, clock
    clock.release()


def test_summary_rows(target):
    constant = LowConfidenceScheduler(steps_per_block=1)
    combos = [SpecCombo("plain", None, constant), SpecCombo("self", ModelDrafter(target), constant, 4, target),
              SpecCombo("lookup", LookupDrafter(), constant, 4)]
    prompts = [[3, 17, 5, 9, 3, 17], [8, 2, 8, 2]]
    plain, self_draft, lookup = summarize(measure(target, prompts, combos, repeats=1, max_new_tokens=9))
    assert all(row["exact"] and row["same_output"] == 100 for row in (plain, self_draft, lookup))
    assert plain["mean_accepted_tokens"] == 1.0 and plain["target_forwards_per_token"] == 1.0
    assert self_draft["acceptance_rate"] == 1.0 and self_draft["mean_accepted_tokens"] > 4
    assert self_draft["draft_forwards_per_token"] > 0 and lookup["draft_forwards_per_token"] == 0
    assert lookup["cost_ratio_c"] == 0.0 and plain["speedup"] == 1.0


def test_speedups_are_ratios_of_the_medians(ticking_target):
    """With one second per target forward, plain AR costs its forwards and lookup drafting its
    (fewer) verifying forwards: the speedup is exactly their ratio, per repeat and as medians."""
    target, clock = ticking_target
    constant = LowConfidenceScheduler(steps_per_block=1)
    combos = [SpecCombo("plain", None, constant), SpecCombo("lookup", LookupDrafter(), constant, 4)]
    prompts = [[3, 17, 5, 9, 3, 17, 5, 9], [8, 2, 8, 2, 8, 2]]
    measured = measure(target, prompts, combos, repeats=2, max_new_tokens=12, clock=clock)
    plain, lookup = summarize(measured)
    forwards = {combo.label: sum(r.result.target_forwards for r in runs.values()) for combo, runs in measured}
    assert measured[0][1].per_repeat() == [forwards["plain"]] * 2
    assert plain["seconds"] == forwards["plain"] and lookup["seconds"] == forwards["lookup"]
    assert lookup["speedup"] == forwards["plain"] / forwards["lookup"]
    assert lookup["target_forwards_per_token"] == forwards["lookup"] / lookup["new_tokens"]


def test_tokens_per_call_by_task(target):
    constant = LowConfidenceScheduler(steps_per_block=1)
    measured = measure(target, [[3, 17, 5], [8, 2, 8], [4, 4]],
                       [SpecCombo("self", ModelDrafter(target), constant, 4, target)], repeats=1,
                       max_new_tokens=9)
    results = [r.result for r in measured[0][1].values()]
    by_task = tokens_per_call_by_task(["b", "a", "b"], results)
    assert list(by_task) == ["a", "b"]
    assert by_task["a"] == len(results[1].tokens) / results[1].target_forwards
    assert by_task["b"] == (len(results[0].tokens) + len(results[2].tokens)) / (
        results[0].target_forwards + results[2].target_forwards)
