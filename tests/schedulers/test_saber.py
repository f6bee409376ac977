"""`saber`: the running-mean bar, the backtracking count and candidates, by hand and in the loop."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import SaberScheduler
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import step_input

VOCAB = 6


def view(top: list[float], masked: list[bool]):
    """One row over a 0..W-1 generation: column i's argmax probability is top[i]."""
    probs = torch.full((1, len(top), VOCAB), 0.0)
    for i, p in enumerate(top):
        probs[0, i, 0] = p
        probs[0, i, 1:] = (1 - p) / (VOCAB - 1)
    mask = torch.tensor([masked])
    inp = step_input(probs=probs, masked=mask)
    return dataclasses.replace(inp, current=torch.where(mask, 5, 0), revisable=~mask)


def test_first_step_bar_is_one_so_the_two_most_confident_commit():
    rule = SaberScheduler()
    decision, state = rule.select(view([0.9, 0.99, 0.5, 0.95], [True] * 4), None)
    assert decision.commit[0].tolist() == [False, True, False, True]
    assert not decision.remask.any()                  # nothing committed before this step
    assert state["committed"][0, :4].tolist() == [False, True, False, True]


def test_the_bar_is_the_mean_confidence_at_commit_and_the_least_improved_token_goes_back():
    rule = SaberScheduler()
    _, state = rule.select(view([0.3, 0.9, 0.3, 0.7, 0.2, 0.2], [True] * 6), None)   # commits 1 and 3
    # mean at commit = (0.9 + 0.7) / 2 = 0.8: columns 0 (0.85) and 4 (0.81) pass, 2 (0.79) does not;
    # column 1 dropped from 0.9 to 0.5 (the least improved), column 3 rose from 0.7 to 0.95
    decision, state = rule.select(view([0.85, 0.5, 0.79, 0.95, 0.81, 0.1],
                                       [True, False, True, False, True, True]), state)
    assert decision.commit[0].tolist() == [True, False, False, False, True, False]
    assert decision.remask[0].tolist() == [False, True, False, False, False, False]   # k = min(1, 2-1)
    assert state["committed"][0, :6].tolist() == [True, False, False, True, True, False]


def test_defaults_and_validation():
    assert (SaberScheduler().min_commit, SaberScheduler().mu, SaberScheduler.revises) == (2, 8, "generated")
    for bad in (dict(min_commit=0), dict(mu=0)):
        with pytest.raises(ValueError):
            SaberScheduler(**bad)


@pytest.mark.parametrize("block", [16, 8])          # 8: the window (and the state) grows per block
def test_decodes_without_masks_and_batched_equals_one_by_one(block):
    model, prompts = tiny_llada(seed=4), [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    config = DecodeConfig(scheduler=SaberScheduler(), gen_length=16, block_length=block, stop_at_eos=False)
    batched = generate(model, prompts, config, trace=True)
    assert not (batched.tokens == model.mask_token_id).any()
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], config)
        assert torch.equal(alone.tokens[0], batched.tokens[row]) and alone.nfe[0] == batched.nfe[row]
