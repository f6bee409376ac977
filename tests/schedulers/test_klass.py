"""KLASS: commit positions that are confident and whose last H step-to-step KLs are all small."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_decode.schedulers import KLASSScheduler, ThresholdScheduler
from tests.schedulers.inputs import step_input

SETTLED = [0.95, 0.05, 0.0]


def view(rows: list[list[list[float]]], step: int, **kw):
    return step_input(probs=torch.tensor(rows), step=step, **kw)


def run(scheduler, views):
    state = scheduler.init_state(views[0].live.shape[0], torch.device("cpu"))
    decisions = []
    for inp in views:
        decision, state = scheduler.select(inp, state)
        decisions.append([row.nonzero().flatten().tolist() for row in decision.commit])
    return decisions, state


def test_ready_only_after_history_steps_of_small_kl():
    # column 0 is settled from the start; column 1 flips at step 1 (large KL), is confident after
    klass = KLASSScheduler(confidence_threshold=0.9, kl_threshold=0.01, history=2,
                           base=ThresholdScheduler(1.0))
    flips = [[0.5, 0.5, 0.0], [0.02, 0.98, 0.0], [0.02, 0.98, 0.0], [0.02, 0.98, 0.0]]
    views = [view([[SETTLED, flips[t]]], t) for t in range(4)]
    decisions, _ = run(klass, views)
    # steps 0-1: too little history -> base (threshold 1.0 passes nothing; the loop would force)
    assert decisions == [[[]], [[]], [[0]], [[0, 1]]]


def test_history_one_fires_a_step_earlier():
    klass = KLASSScheduler(history=1, base=ThresholdScheduler(1.0))
    decisions, _ = run(klass, [view([[SETTLED]], 0), view([[SETTLED]], 1)])
    assert decisions == [[[]], [[0]]]


@pytest.mark.parametrize("kl_threshold, ready", [(0.37, True), (0.36, False)])
def test_kl_is_the_full_vocabulary_divergence_of_now_from_before(kl_threshold, ready):
    # KL([0.9, 0.1] || [0.5, 0.5]) = 0.9 ln 1.8 + 0.1 ln 0.2 = 0.3681
    klass = KLASSScheduler(confidence_threshold=0.8, kl_threshold=kl_threshold, history=1,
                           base=ThresholdScheduler(1.0))
    decisions, _ = run(klass, [view([[[0.5, 0.5, 0.0]]], 0), view([[[0.9, 0.1, 0.0]]], 1)])
    assert math.isclose(0.9 * math.log(1.8) + 0.1 * math.log(0.2), 0.3681, abs_tol=1e-4)
    assert decisions[1] == [[0] if ready else []]


def test_confidence_bar_is_strict():
    klass = KLASSScheduler(confidence_threshold=0.95, history=1, base=ThresholdScheduler(1.0))
    decisions, _ = run(klass, [view([[SETTLED]], 0), view([[SETTLED]], 1)])
    assert decisions[1] == [[]]


def test_rows_without_ready_positions_fall_back_per_row():
    # row 0: column 0 settles (ready), column 1 flips (confident, not stable) -> only column 0.
    # row 1: both columns flip -> nothing ready -> the base's own choice (threshold 0.5: both).
    # The reference reset the whole batch's selection inside its per-row fallback loop.
    klass = KLASSScheduler(history=1, base=ThresholdScheduler(0.5))
    flip = [[0.6, 0.4, 0.0], [0.4, 0.6, 0.0]]
    views = [view([[SETTLED, flip[t]], [flip[t], flip[1 - t]]], t) for t in range(2)]
    decisions, _ = run(klass, views)
    assert decisions[1] == [[0], [0, 1]]


def test_state_keeps_only_the_active_blocks_rows():
    # window of 6 columns, block [1, 3): the stored probabilities cover 2 columns
    klass = KLASSScheduler()
    probs = [[SETTLED] * 6]
    _, state = run(klass, [view(probs, 0, block=[(1, 3)]), view(probs, 1, block=[(1, 3)])])
    assert state["probs"].shape == (1, 2, 3)


def test_a_new_block_starts_without_history():
    klass = KLASSScheduler(history=1, base=ThresholdScheduler(1.0))
    probs = [[SETTLED] * 4]
    views = [view(probs, 0, block=[(0, 2)]), view(probs, 0, block=[(2, 4)]), view(probs, 1, block=[(2, 4)])]
    decisions, _ = run(klass, views)
    assert decisions == [[[]], [[]], [[2, 3]]]


@pytest.mark.parametrize("bad, message", [
    (dict(confidence_threshold=1.0), "confidence_threshold"), (dict(kl_threshold=0.0), "kl_threshold"),
    (dict(history=0), "history must be >= 1, got 0"),
])
def test_invalid_fields_are_rejected(bad, message):
    with pytest.raises(ValueError, match=message):
        KLASSScheduler(**bad)
