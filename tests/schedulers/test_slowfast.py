"""SlowFast: a slow phase estimates how far the model is sure, a fast phase fills that span."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import LowConfidenceScheduler, SlowFastScheduler
from dllm_decode.schedulers.slowfast import FAST, SLOW
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import with_confidence


def steps(scheduler, confs, masked=None):
    state = scheduler.init_state(1, torch.device("cpu"))
    out = []
    for step, conf in enumerate(confs):
        inp = with_confidence([conf], step=step, masked=None if masked is None else masked[step])
        decision, state = scheduler.select(inp, state)
        out.append(decision.commit[0].nonzero().flatten().tolist())
    return out, state


@pytest.mark.parametrize("second, stable", [(4, True), (2, True), (5, False), (6, False)])
def test_two_estimates_are_stable_iff_they_differ_by_at_most_one(second, stable):
    # block of 8, span bar 0.3: the first estimate is offset 2 + 1 = 3, the second `second`
    first = [0.2, 0.2, 0.35, 0.1, 0.1, 0.1, 0.1, 0.1]
    later = [0.1] * 8
    later[second - 1] = 0.35
    rule = SlowFastScheduler(explore_steps=3, high_threshold=float("inf"))
    _, state = steps(rule, [first, later])
    assert bool(state["determined"][0]) == stable
    assert int(state["end"][0]) == (second if stable else (3 + second) // 2)   # the integer mean, not fixed


def test_unstable_history_falls_back_to_the_integer_mean_at_the_last_slow_step():
    first = [0.35, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]                  # estimate 1
    later = [0.1, 0.1, 0.1, 0.1, 0.1, 0.35, 0.1, 0.1]                  # estimate 6
    rule = SlowFastScheduler(explore_steps=2, high_threshold=float("inf"))
    _, state = steps(rule, [first, later])
    assert int(state["end"][0]) == 3 and int(state["phase"][0]) == FAST   # int((1 + 6) / 2)


def test_fast_phase_commits_only_inside_the_span_and_then_restarts():
    conf = [0.95, 0.95, 0.1, 0.35, 0.1, 0.1, 0.1, 0.1]                # estimates 4, 4: span [0, 4)
    fast = [0.0, 0.0, 0.1, 0.0, 0.99, 0.99, 0.1, 0.1]
    rule = SlowFastScheduler(explore_steps=2, high_threshold=0.9)
    masked = [torch.ones(1, 8, dtype=torch.bool) for _ in range(3)]
    masked[1][0, [0, 1]] = False
    masked[2][0, [0, 1, 3]] = False
    commits, state = steps(rule, [conf, conf, fast], masked)
    assert commits[0] == [0, 1]                                        # > 1 high: all of them
    assert commits[1] == [3]                                           # one high or none: the scope's best
    assert commits[2] == [2]                                           # fast: inside [0, 4) only, not 4, 5
    assert int(state["start"][0]) == 4 and int(state["phase"][0]) == SLOW   # span done: next sub-cycle


@pytest.fixture(scope="module")
def model():
    return tiny_llada(seed=4)


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]


def run(model, scheduler, prompts=PROMPTS, gen_length=16, block_length=8):
    config = DecodeConfig(scheduler=scheduler, gen_length=gen_length, block_length=block_length, stop_at_eos=False)
    return generate(model, prompts, config)


def test_no_high_bar_and_no_fast_phase_is_low_confidence_one_token_per_step(model):
    slow = run(model, SlowFastScheduler(high_threshold=float("inf"), explore_steps=8))
    base = run(model, LowConfidenceScheduler())
    assert torch.equal(slow.tokens, base.tokens) and torch.equal(slow.nfe, base.nfe)


def test_rows_in_different_phases_decode_as_alone(model):
    rule = SlowFastScheduler(explore_steps=2, high_threshold=0.2, span_threshold=0.1)
    batched = run(model, rule)
    for row, prompt in enumerate(PROMPTS):
        alone = run(model, rule, [prompt])
        assert torch.equal(batched.tokens[row], alone.tokens[0]) and batched.nfe[row] == alone.nfe[0]
    assert not (batched.tokens == model.mask_token_id).any()
