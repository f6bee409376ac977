"""DUS: dilated groups, one per step; deferred positions join the next level (the reference's bug)."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import DUSScheduler, LowConfidenceScheduler
from dllm_decode.schedulers.dus import dilated_levels
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import with_confidence

SIZES = {1: [1], 2: [2], 3: [3], 4: [2, 2], 5: [5], 6: [2, 4], 8: [2, 2, 4], 12: [2, 2, 8], 16: [2, 2, 4, 8],
         24: [2, 2, 4, 16], 32: [2, 2, 4, 8, 16], 64: [2, 2, 4, 8, 16, 32]}


@pytest.mark.parametrize("length", sorted(SIZES))
def test_level_sizes_match_the_reference_and_partition_the_block(length):
    levels = dilated_levels(length)
    assert [len(g) for g in levels] == SIZES[length]
    assert sorted(o for g in levels for o in g) == list(range(length))
    if length >= 4 and length & (length - 1) == 0:                  # powers of the base
        assert all(b - a >= 2 for g in levels for a, b in zip(g, g[1:]))


def test_base_four_and_base_one():
    assert [len(g) for g in dilated_levels(32, base=4)] == [4, 12, 16]
    assert dilated_levels(8, base=1) == [list(range(8))]


@pytest.fixture(scope="module")
def model():
    return tiny_llada(seed=5)


PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]


def run(model, scheduler, gen_length=32, block_length=32):
    config = DecodeConfig(scheduler=scheduler, gen_length=gen_length, block_length=block_length, stop_at_eos=False)
    return generate(model, PROMPTS, config)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.99])
def test_every_block_ends_in_exactly_its_number_of_levels(model, threshold):
    out = run(model, DUSScheduler(remask_threshold=threshold), gen_length=64, block_length=32)
    assert not (out.tokens == model.mask_token_id).any()
    assert out.nfe.tolist() == [10, 10]                               # 2 blocks x 5 levels


def test_one_group_commits_the_block_in_one_step_like_low_confidence_one_step(model):
    dus = run(model, DUSScheduler(base=1), gen_length=16, block_length=8)
    one = run(model, LowConfidenceScheduler(steps_per_block=1), gen_length=16, block_length=8)
    assert torch.equal(dus.tokens, one.tokens) and dus.nfe.tolist() == one.nfe.tolist() == [2, 2]


def test_block_length_one_is_one_token_per_step_left_to_right(model):
    dus = run(model, DUSScheduler(), gen_length=8, block_length=1)
    one = run(model, LowConfidenceScheduler(), gen_length=8, block_length=1)
    assert torch.equal(dus.tokens, one.tokens) and dus.nfe.tolist() == [8, 8]


def test_deferred_position_joins_the_next_level_and_ties_pass():
    # block of 8: levels {0, 4}, {2, 6}, {1, 3, 5, 7}
    dus = DUSScheduler(remask_threshold=0.3)
    conf = [[0.1, 0.9, 0.9, 0.9, 0.3, 0.9, 0.9, 0.9]]
    step0 = dus.select(with_confidence(conf, step=0), None)[0].commit
    assert step0[0].nonzero().flatten().tolist() == [4]                 # 0 deferred, 4 passes on the tie
    masked = torch.ones(1, 8, dtype=torch.bool)
    masked[0, 4] = False
    conf1 = [[0.5, 0.9, 0.1, 0.9, 0.0, 0.9, 0.2, 0.9]]
    step1 = dus.select(with_confidence(conf1, masked=masked, step=1), None)[0].commit
    assert step1[0].nonzero().flatten().tolist() == [0]                 # the deferred column, not 1/3/5/7
    conf2 = [[0.1, 0.2, 0.1, 0.9, 0.0, 0.9, 0.2, 0.9]]
    step1b = dus.select(with_confidence(conf2, masked=masked, step=1), None)[0].commit
    assert step1b[0].nonzero().flatten().tolist() == [6]                # nothing passes: the best due one


def test_confidence_order_commits_the_level_sizes_by_confidence():
    dus = DUSScheduler(order="confidence")
    conf = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]
    for step, k in enumerate([2, 2, 8]):
        commit = dus.select(with_confidence(conf, step=step), None)[0].commit[0]
        assert commit.sum() == k and commit[8 - k:].all()


def test_rows_with_different_block_lengths_are_scheduled_by_their_own():
    dus = DUSScheduler(remask_threshold=0.0)
    inp = with_confidence([[0.5] * 8, [0.5] * 8], block=[(0, 8), (0, 4)])
    commit = dus.select(inp, None)[0].commit
    assert commit[0].nonzero().flatten().tolist() == [0, 4]
    assert commit[1].nonzero().flatten().tolist() == [0, 2]


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(ValueError, match="order must be one of"):
        DUSScheduler(order="binary")
    with pytest.raises(ValueError, match="base must be >= 1"):
        DUSScheduler(base=0)


@pytest.mark.parametrize("n, groups", [(4, (2, 2)), (8, (2, 2, 4))])
def test_on_the_ideal_model_shuffle_accuracy_is_the_product_over_groups(n, groups):
    # greedy, no deferral: each group of k draws k items independently from the m left, so the
    # answer is a permutation with probability prod P(m, k) / m^k (0.375 at n = 4, 0.0684 at n = 8)
    import math

    from dllm_decode.eval.harness.grid import Setting
    from dllm_decode.eval.harness.runner import ideal_decoder
    from dllm_decode.eval.tasks import TASKS

    expected, left = 1.0, n
    for k in groups:
        expected *= math.perm(left, k) / left ** k
        left -= k
    task = TASKS["shuffle"]
    examples = task.examples("test", 200, 0, lengths=(n, n))
    setting = Setting("dus", options=(("remask_threshold", "0.0"),), gen_length=None, block_length=None)
    rows, _ = ideal_decoder(0.01)([e.prompt for e in examples], setting, n, torch.Generator().manual_seed(1))
    accuracy = sum(task.score(e, r["output"]) for e, r in zip(examples, rows)) / len(examples)
    se = math.sqrt(expected * (1 - expected) / len(examples))
    assert abs(accuracy - expected) < 4 * se                       # one token per step scores ~1.0
    assert all(r["nfe"] == len(groups) for r in rows)
