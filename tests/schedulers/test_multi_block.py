"""Multi-block pipelined decoding: sub-blocks join and activate on their predecessor's progress."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import EntropyThresholdScheduler, MultiBlockScheduler
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import step_input


def view(masked: torch.Tensor, entropy_low: list[int], step: int):
    """An 8-column region: columns in `entropy_low` are certain, the others uniform over 4 ids."""
    probs = torch.full((1, 8, 5), 0.25)
    probs[..., 4] = 0.0
    for c in entropy_low:
        probs[0, c] = torch.tensor([1.0, 0, 0, 0, 0])
    return step_input(probs=probs, masked=masked, step=step)


def test_next_sub_block_is_not_eligible_before_its_predecessor_reaches_the_add_bar():
    rule = MultiBlockScheduler(threshold=0.1, sub_block=4, add_threshold=0.5, activate_threshold=1.0)
    state = None
    masked = torch.ones(1, 8, dtype=torch.bool)
    decision, state = rule.select(view(masked, [5, 6], 0), state)
    assert decision.commit[0].nonzero().flatten().tolist() == [0]      # 5, 6 are certain but not added
    masked[0, :2] = False                                              # progress 0.5: sub-block 1 joins
    decision, state = rule.select(view(masked, [5, 6], 1), state)
    assert decision.commit[0].nonzero().flatten().tolist() == [2, 5, 6]  # 2: sub-block 0 is forced
    assert state["added"][0].tolist() == [True, True] and state["active"][0].tolist() == [True, False]


def test_without_the_global_min_only_the_first_active_sub_block_is_forced():
    rule = MultiBlockScheduler(threshold=0.1, sub_block=4, add_threshold=0.0, activate_threshold=1.0, global_min=False)
    masked = torch.ones(1, 8, dtype=torch.bool)
    masked[0, 0] = False
    probs_low = [6]                                                    # lowest entropy is outside sub-block 0
    decision, _ = rule.select(view(masked, probs_low, 1), {"added": torch.tensor([[True, True]]),
                                                            "active": torch.tensor([[True, False]])})
    assert decision.commit[0].nonzero().flatten().tolist() == [1, 6]   # 6 passes the gate; 1 is forced
    rule_sglang = MultiBlockScheduler(threshold=0.0, sub_block=4, add_threshold=0.0, global_min=False)
    decision, _ = rule_sglang.select(view(masked, [], 1), {"added": torch.tensor([[True, True]]),
                                                           "active": torch.tensor([[True, False]])})
    assert decision.commit[0].nonzero().flatten().tolist() == [1]


@pytest.fixture(scope="module")
def model():
    return tiny_llada(seed=6)


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]


def run(model, scheduler, block_length, prompts=PROMPTS):
    config = DecodeConfig(scheduler=scheduler, gen_length=16, block_length=block_length, stop_at_eos=False)
    return generate(model, prompts, config)


@pytest.mark.parametrize("tau", [0.0, 2.0, 3.4])
def test_strictly_sequential_sub_blocks_are_the_entropy_threshold_rule(model, tau):
    multi = run(model, MultiBlockScheduler(threshold=tau, sub_block=4, add_threshold=1.0, activate_threshold=1.0), 16)
    plain = run(model, EntropyThresholdScheduler(threshold=tau), 4)
    assert torch.equal(multi.tokens, plain.tokens) and torch.equal(multi.nfe, plain.nfe)


def test_pipelining_takes_fewer_forwards_than_sequential_blocks(model):
    rule = MultiBlockScheduler(threshold=3.4, sub_block=4, add_threshold=0.0, activate_threshold=0.0)
    pipelined = run(model, rule, 16)
    sequential = run(model, MultiBlockScheduler(threshold=3.4, sub_block=4, add_threshold=1.0, activate_threshold=1.0), 16)
    assert not (pipelined.tokens == model.mask_token_id).any()
    assert (pipelined.nfe <= sequential.nfe).all()


def test_one_sub_block_joins_per_step_and_max_blocks_bounds_the_region(model):
    # no gate (tau = inf), add at once: step k sees sub-blocks 0..k+1, so 16 columns in 4s take 3
    # forwards; regions of 2 sub-blocks take one forward each
    free = run(model, MultiBlockScheduler(threshold=float("inf"), sub_block=4, add_threshold=0.0), 16)
    bounded = run(model, MultiBlockScheduler(threshold=float("inf"), sub_block=4, add_threshold=0.0, max_blocks=2), 16)
    assert free.nfe.tolist() == [3, 3] and bounded.nfe.tolist() == [2, 2]
    assert not (bounded.tokens == model.mask_token_id).any()
