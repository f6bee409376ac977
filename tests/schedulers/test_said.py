"""SAID: checkerboard stages and the reference's step plan; one stage is LLaDA's low-confidence
rule with the same steps per block."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import LowConfidenceScheduler, SAIDScheduler
from dllm_decode.schedulers.said import said_stages, said_steps
from dllm_decode.testing import tiny_llada

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]

STAGES = {   # (block length, stages) -> the reference partition, written out
    (4, 2): [[0, 2], [1, 3]],
    (8, 2): [[0, 2, 4, 6], [1, 3, 5, 7]],
    (8, 3): [[0, 4], [2, 6], [1, 3, 5, 7]],
    (8, 4): [[0], [4], [2, 6], [1, 3, 5, 7]],
    (16, 3): [[0, 4, 8, 12], [2, 6, 10, 14], [1, 3, 5, 7, 9, 11, 13, 15]],
    (16, 4): [[0, 8], [4, 12], [2, 6, 10, 14], [1, 3, 5, 7, 9, 11, 13, 15]],
    (32, 2): [list(range(0, 32, 2)), list(range(1, 32, 2))],
}


@pytest.mark.parametrize("key", sorted(STAGES))
def test_stage_partition_matches_the_reference(key):
    assert said_stages(*key) == STAGES[key]


def test_step_plan_matches_the_reference():
    assert said_steps(3, 4, 2) == [1, 1, 2]                 # GSM8K config: block 16, 4 steps
    assert said_steps(3, 128, 2) == [95, 31, 2]             # the README example, by the code
    assert said_steps(1, 7, 2) == [7] and said_steps(2, 7, 2) == [5, 2]
    assert sum(said_steps(4, 64, 1)) == 64


def decode(scheduler, block_length=4, gen_length=8):
    config = DecodeConfig(scheduler, gen_length=gen_length, block_length=block_length, stop_at_eos=False)
    return generate(tiny_llada(seed=6), PROMPTS, config)


@pytest.mark.parametrize("steps", [0, 2])
def test_one_stage_is_low_confidence_with_the_same_steps(steps):
    got = decode(SAIDScheduler(num_stages=1, steps_per_block=steps))
    want = decode(LowConfidenceScheduler(steps_per_block=steps or None))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.nfe, want.nfe)


def test_forwards_per_block_are_the_clamped_plan():
    # block 16, 16 steps, 3 stages: the plan [11, 3, 2] clamps to the stage sizes [4, 4, 8] -> 4+3+2
    got = decode(SAIDScheduler(), block_length=16, gen_length=32)
    assert got.nfe.tolist() == [18, 18]


def test_scaffold_columns_are_committed_before_the_odd_ones():
    model, gen_start = tiny_llada(seed=6), 3
    seen = []

    def spy(self, inp, state):
        decision, state = SAIDScheduler.select(self, inp, state)
        seen.append((decision.commit & inp.eligible)[0].nonzero().flatten() + inp.offset - gen_start)
        return decision, state

    rule = SAIDScheduler(num_stages=2, rec_steps=1)
    object.__setattr__(rule, "select", spy.__get__(rule))
    generate(model, [PROMPTS[0]], DecodeConfig(rule, gen_length=8, block_length=8, stop_at_eos=False))
    order = [int(c) for step in seen for c in step]
    assert set(order[:4]) == {0, 2, 4, 6} and set(order[4:]) == {1, 3, 5, 7}
    assert len(seen) == 5                        # the plan [7, 1] clamps to the stage sizes: [4, 1]
