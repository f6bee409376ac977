"""dParallel's entropy-threshold rule on hand-written distributions (exact entropies)."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import EntropyThresholdScheduler, ThresholdScheduler
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import step_input


def two_way(p: float, vocab: int = 4) -> list[float]:
    """A distribution with mass p on token 0 and 1 - p on token 1 (entropy h(p) nats)."""
    return [p, 1 - p] + [0.0] * (vocab - 2)


def h(p: float) -> float:
    return -sum(q * math.log(q) for q in (p, 1 - p) if q > 0)


def committed(scheduler, inp) -> list[list[int]]:
    decision, _ = scheduler.select(inp, None)
    return [row.nonzero().flatten().tolist() for row in decision.commit]


def test_commits_every_position_at_or_below_the_bar():
    probs = torch.tensor([[two_way(0.5), two_way(0.95), two_way(1.0), two_way(0.8), two_way(0.9)]])
    # entropies 0.693, 0.199, 0, 0.500, 0.325
    assert committed(EntropyThresholdScheduler(0.4), step_input(probs=probs)) == [[1, 2, 4]]
    assert committed(EntropyThresholdScheduler(0.1), step_input(probs=probs)) == [[2]]


def test_a_position_exactly_on_the_bar_passes():
    probs = torch.tensor([[two_way(1.0), two_way(0.8), two_way(0.5)]])
    on_bar = torch.tensor(two_way(0.8))
    bar = float(-(on_bar * on_bar.clamp_min(1e-30).log()).sum())       # the rule's own float32 value
    assert committed(EntropyThresholdScheduler(bar), step_input(probs=probs)) == [[0, 1]]
    below = float(torch.nextafter(torch.tensor(bar), torch.tensor(0.0)))   # one float32 step down
    assert committed(EntropyThresholdScheduler(below), step_input(probs=probs)) == [[0]]


def test_with_nothing_under_the_bar_the_lowest_entropy_position_commits_not_the_most_confident():
    # column 0: top-1 0.6 over a flat rest (high entropy); column 1: 0.55 / 0.45 (low entropy).
    # The confidence rule's forced pick is column 0; dParallel's is the lowest entropy, column 1.
    flat = [0.6] + [0.4 / 9] * 9
    peaked = [0.55, 0.45] + [0.0] * 8
    probs = torch.tensor([[flat, peaked]])
    inp = step_input(probs=probs)
    assert h(0.55) < -sum(q * math.log(q) for q in flat)
    assert committed(EntropyThresholdScheduler(0.01), inp) == [[1]]
    assert committed(ThresholdScheduler(0.99), inp) == [[]]          # the loop would force column 0


def test_equal_lowest_entropies_force_the_lower_column_and_ineligible_columns_never_pass():
    probs = torch.tensor([[two_way(0.7), two_way(0.7), two_way(0.7)],
                          [two_way(1.0), two_way(0.6), two_way(0.7)]])
    masked = torch.tensor([[True, True, True], [False, True, True]])
    out = committed(EntropyThresholdScheduler(0.0), step_input(probs=probs, masked=masked))
    assert out == [[0], [2]]                       # row 1: column 0 is certain but already committed


def test_rows_outside_their_block_or_without_work_commit_nothing():
    probs = torch.tensor([[two_way(1.0)] * 4, [two_way(1.0)] * 4])
    masked = torch.tensor([[True, True, True, True], [False, False, False, False]])
    inp = step_input(probs=probs, masked=masked, block=[(2, 4), (0, 4)])
    assert committed(EntropyThresholdScheduler(), inp) == [[2, 3], []]


def test_infinite_bar_commits_the_whole_block_and_bad_bars_are_refused():
    probs = torch.tensor([[two_way(0.5)] * 3])
    assert committed(EntropyThresholdScheduler(math.inf), step_input(probs=probs)) == [[0, 1, 2]]
    for bad in (-0.1, math.nan):
        with pytest.raises(ValueError, match="threshold must be in"):
            EntropyThresholdScheduler(bad)


def test_decodes_end_to_end_one_step_per_block_at_an_infinite_bar():
    model = tiny_llada(seed=3)
    prompts = [[1, 2, 3], [4, 5]]
    for tau, bound in ((0.0, 16), (0.5, 16), (math.inf, 2)):
        result = generate(model, prompts, DecodeConfig(EntropyThresholdScheduler(tau), gen_length=16,
                                                       block_length=8))
        assert not (result.tokens == model.mask_token_id).any()
        assert (result.nfe >= 2).all() and (result.nfe <= bound).all()
