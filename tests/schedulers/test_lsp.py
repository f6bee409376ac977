"""LSP: the longest stable run from the frontier, snapped to a delimiter; degenerate settings
reduce to the threshold rule (tau 0, no snap) and to left-to-right decoding (tau > 1)."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import LowConfidenceScheduler, LSPScheduler, ThresholdScheduler
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import step_input
from tests.schedulers.test_contract import random_input

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]


def decode(scheduler, block_length=4, gen_length=8):
    config = DecodeConfig(scheduler, gen_length=gen_length, block_length=block_length, stop_at_eos=False)
    return generate(tiny_llada(seed=5), PROMPTS, config)


def test_threshold_zero_without_snap_is_the_whole_block_in_one_step():
    got, want = decode(LSPScheduler(threshold=0.0, snap=False)), decode(ThresholdScheduler(threshold=1e-9))
    assert torch.equal(got.tokens, want.tokens)
    assert got.nfe.tolist() == [2, 2]                      # two blocks, one step each


def test_nothing_stable_is_left_to_right_one_token_per_step():
    got, want = decode(LSPScheduler(threshold=2.0)), decode(LowConfidenceScheduler(), block_length=1)
    assert torch.equal(got.tokens, want.tokens)
    assert got.nfe.tolist() == [8, 8]


def view(tokens, confidence, masked=None):
    """A one-row view whose candidate at column i is tokens[i] with probability confidence[i]."""
    vocab = 6
    probs = torch.zeros(1, len(tokens), vocab)
    for i, (t, c) in enumerate(zip(tokens, confidence)):
        probs[0, i] = (1 - c) / (vocab - 1)
        probs[0, i, t] = c
    return step_input(probs=probs, masked=None if masked is None else torch.tensor([masked]))


def test_the_run_is_cut_after_its_last_delimiter():
    # columns: A , B C  then an unstable one; delimiter id 5 stands for ","
    inp = view([1, 5, 2, 3, 4], [0.95, 0.97, 0.99, 0.92, 0.3])
    snapped = LSPScheduler(delimiter_ids=(5,)).select(inp, None)[0].commit[0].tolist()
    assert snapped == [True, True, False, False, False]
    assert LSPScheduler(delimiter_ids=(5,), snap=False).select(inp, None)[0].commit[0].tolist() == \
        [True, True, True, True, False]
    no_delimiter = view([1, 2, 2, 3, 4], [0.95, 0.97, 0.99, 0.92, 0.3])
    assert LSPScheduler(delimiter_ids=(5,)).select(no_delimiter, None)[0].commit[0].tolist() == \
        [True, True, True, True, False]


def test_the_run_starts_at_the_frontier_and_stops_at_a_committed_column():
    inp = view([1, 2, 3, 4, 1], [0.99, 0.99, 0.99, 0.99, 0.99], masked=[False, True, True, False, True])
    assert LSPScheduler().select(inp, None)[0].commit[0].tolist() == [False, True, True, False, False]
    unstable = view([1, 2, 3, 4], [0.2, 0.95, 0.95, 0.95])    # an unstable frontier commits alone
    assert LSPScheduler().select(unstable, None)[0].commit[0].tolist() == [True, False, False, False]
    capped = view([1, 2, 3, 4], [0.95] * 4)
    assert LSPScheduler(max_commit=2).select(capped, None)[0].commit[0].tolist() == [True, True, False, False]


def test_persistence_needs_the_same_candidate_as_the_last_step():
    rule = LSPScheduler(stability="persistent")
    state = rule.init_state(1, torch.device("cpu"))
    first, state = rule.select(view([1, 2, 3, 4], [0.95] * 4), state)
    assert first.commit[0].tolist() == [True, False, False, False]     # no history yet: frontier
    second, _ = rule.select(view([1, 2, 4, 4], [0.95] * 4), state)
    assert second.commit[0].tolist() == [True, True, False, False]     # column 2 changed


@pytest.mark.parametrize("seed", range(20))
def test_commits_are_a_contiguous_run_from_the_frontier(seed):
    inp = random_input(seed)
    commit = LSPScheduler(threshold=0.3).select(inp, None)[0].commit
    columns = inp.columns.unsqueeze(0)
    open_ = inp.is_masked & (columns >= inp.block[:, :1]) & (columns < inp.block[:, 1:])
    for row in range(commit.shape[0]):
        picked = commit[row].nonzero().flatten().tolist()
        if not picked:
            continue
        assert picked == list(range(picked[0], picked[-1] + 1))          # contiguous
        assert picked[0] == int(open_[row].nonzero()[0])                 # from the frontier


@pytest.mark.parametrize("bad, match", [({"threshold": -0.1}, "threshold"), ({"stability": "x"}, "stability"),
                                        ({"max_commit": -1}, "max_commit"), ({"delimiter_ids": (-1,)}, "delimiter")])
def test_bad_options_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        LSPScheduler(**bad)
