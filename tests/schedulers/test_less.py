"""LESS: confident, persistent top-1 and top-K JS-stable positions commit; else the base rule."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_decode.schedulers import LESSScheduler, ThresholdScheduler
from dllm_decode.schedulers.less import topk_js
from tests.schedulers.inputs import step_input

SETTLED = [0.95, 0.05, 0.0]


def run(scheduler, prob_rows, **kw):
    state = scheduler.init_state(1, torch.device("cpu"))
    out = []
    for step, rows in enumerate(prob_rows):
        decision, state = scheduler.select(step_input(probs=torch.tensor([rows]), step=step, **kw), state)
        out.append(decision.commit[0].nonzero().flatten().tolist())
    return out


def test_nothing_is_ready_in_the_first_step_then_confident_stable_columns_are():
    less = LESSScheduler(confidence=0.9, persistence=2, top_k=2, base=ThresholdScheduler(1.0))
    assert run(less, [[SETTLED, SETTLED]] * 3) == [[], [0, 1], [0, 1]]


def test_a_top1_flip_restarts_the_run():
    less = LESSScheduler(confidence=0.6, persistence=2, top_k=3, js_threshold=float("inf"),
                         base=ThresholdScheduler(1.0))
    flip = [[0.7, 0.3, 0.0]], [[0.3, 0.7, 0.0]], [[0.3, 0.7, 0.0]]
    assert run(less, flip) == [[], [], [0]]


def test_persistence_one_without_js_is_the_confidence_gate_with_the_fallback():
    less = LESSScheduler(confidence=0.8, persistence=1, js_threshold=float("inf"), base=ThresholdScheduler(0.5))
    rows = [[0.85, 0.15, 0.0], [0.6, 0.4, 0.0], [0.3, 0.3, 0.4]]
    assert run(less, [rows, rows]) == [[0, 1], [0]]                    # step 0: the base (>= 0.5)


def test_js_bar_blocks_a_moving_distribution():
    less = LESSScheduler(confidence=0.5, persistence=1, top_k=2, js_threshold=0.01, base=ThresholdScheduler(1.0))
    assert run(less, [[[0.95, 0.05, 0.0]], [[0.6, 0.4, 0.0]]]) == [[], []]
    assert run(less, [[[0.95, 0.05, 0.0]], [[0.94, 0.06, 0.0]]]) == [[], [0]]


def dist(values):
    p = torch.tensor(values, dtype=torch.float32)
    return p / p.sum()


@settings(max_examples=50, deadline=None)
@given(a=st.lists(st.floats(0.01, 1.0), min_size=6, max_size=6), b=st.lists(st.floats(0.01, 1.0), min_size=6, max_size=6),
       k=st.integers(1, 6))
def test_topk_js_is_symmetric_zero_on_itself_and_at_most_ln2(a, b, k):
    p, q = dist(a).topk(k), dist(b).topk(k)
    forward = topk_js(p.indices, p.values, q.indices, q.values)
    backward = topk_js(q.indices, q.values, p.indices, p.values)
    assert torch.isclose(forward, backward, atol=1e-6)
    assert 0 <= float(forward) <= math.log(2) + 1e-6
    assert abs(float(topk_js(p.indices, p.values, p.indices, p.values))) < 1e-6


def test_disjoint_supports_reach_ln2():
    ids_p, ids_q = torch.tensor([0]), torch.tensor([1])
    assert math.isclose(float(topk_js(ids_p, torch.tensor([1.0]), ids_q, torch.tensor([1.0]))), math.log(2), rel_tol=1e-5)


def test_history_follows_the_column_when_the_block_moves():
    less = LESSScheduler(confidence=0.9, persistence=2, top_k=2, base=ThresholdScheduler(1.0))
    state = less.init_state(1, torch.device("cpu"))
    probs = torch.tensor([[SETTLED] * 4])
    _, state = less.select(step_input(probs=probs, block=[(0, 4)], step=0), state)
    decision, _ = less.select(step_input(probs=probs[:, 2:], offset=2, block=[(2, 4)], step=1), state)
    assert decision.commit[0].tolist() == [True, True]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="persistence must be >= 1"):
        LESSScheduler(persistence=0)
