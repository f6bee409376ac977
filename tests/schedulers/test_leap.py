"""LEAP: without look-ahead (or without candidates) it is its base rule; a candidate commits only
when every future agrees on it; the look-ahead forward is counted."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.caches import CACHES
from dllm_decode.schedulers import LEAPScheduler, ThresholdScheduler
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import step_input

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]


def decode(scheduler, cache="none"):
    config = DecodeConfig(scheduler, cache=CACHES[cache](), gen_length=16, block_length=8)
    return generate(tiny_llada(seed=8, layers=2), PROMPTS, config)


@pytest.mark.parametrize("cache", ["none", "prefix"])
def test_no_superposition_is_the_base_rule_under_any_cache(cache):
    got, want = decode(LEAPScheduler(superpose=0), cache), decode(ThresholdScheduler(), cache)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.nfe, want.nfe)


def test_no_candidate_is_the_base_rule_and_runs_no_look_ahead():
    got, want = decode(LEAPScheduler(low=1.0)), decode(ThresholdScheduler())
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.nfe, want.nfe)


def test_the_look_ahead_is_counted_and_commits_at_least_the_base():
    """Two candidates a step, the other masks filled in the futures: a step with a mask to fill
    runs one look-ahead call of 4 canvases, counted as one forward and 4 forward rows."""
    leap = decode(LEAPScheduler(low=0.0, agree=0.01, max_candidates=2))
    assert not (leap.tokens == 36).any()
    looks = leap.forward_rows - leap.nfe
    assert (looks > 0).all() and (looks % 3 == 0).all()
    assert (leap.nfe - looks // 3 <= 16).all()                  # decode steps: at most one per token


def view():
    """One row of 4 masked columns: col 0 clears the base's bar, 1 and 2 are candidates, 3 is not."""
    probs = torch.full((1, 4, 6), 0.0)
    for col, (token, p) in enumerate([(1, 0.95), (2, 0.7), (3, 0.6), (4, 0.3)]):
        probs[0, col] = (1 - p) / 5
        probs[0, col, token] = p
    return step_input(probs=probs)


def test_futures_write_the_base_commits_and_fill_everything_but_the_candidates():
    rule = LEAPScheduler(superpose=2)
    inp = view()
    actions, tokens, _ = rule.lookahead(inp, rule.init_state(1, torch.device("cpu")))
    assert actions.shape == (1, 2, 4)
    assert actions[0].tolist() == [[True, False, False, True]] * 2
    assert tokens[0, :, 0].tolist() == [1, 1] and tokens[0, 0, 3] == 4 and tokens[0, 1, 3] != 4


def test_a_candidate_commits_only_when_every_future_agrees():
    rule = LEAPScheduler(superpose=2, agree=0.9)
    inp = view()
    top = torch.tensor([[[1, 2, 3, 4], [1, 2, 5, 4]]])            # future 1 flips column 2
    prob = torch.tensor([[[1.0, 0.95, 0.99, 0.5], [1.0, 0.93, 0.99, 0.5]]])
    inp = dataclasses.replace(inp, lookahead_top=top, lookahead_top_prob=prob)
    decision, _ = rule.select(inp, rule.init_state(1, torch.device("cpu")))
    assert decision.commit[0].tolist() == [True, True, False, False]
    weak = dataclasses.replace(inp, lookahead_top_prob=prob * 0.9)  # agrees, but mean prob < 0.9
    assert LEAPScheduler(superpose=2).select(weak, rule.init_state(1, torch.device("cpu")))[0].commit[0].tolist() == \
        [True, False, False, False]


def test_runs_under_no_cache_only_while_it_looks_ahead():
    assert LEAPScheduler().caches == ("none",) and LEAPScheduler(superpose=0).caches is None


@pytest.mark.parametrize("bad, match", [({"low": 1.5}, "low"), ({"superpose": -1}, "superpose"),
                                        ({"agree": 0.0}, "agree"), ({"max_candidates": 0}, "max_candidates")])
def test_bad_options_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        LEAPScheduler(**bad)
