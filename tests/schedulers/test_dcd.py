"""DCD: a sliding window over the whole generation; a window as wide as the generation is the
threshold rule over one block, a window of one is left-to-right decoding."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import DCDScheduler, LowConfidenceScheduler, ThresholdScheduler
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import with_confidence

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]


def decode(scheduler, block_length=4, gen_length=12, stop_at_eos=False):
    config = DecodeConfig(scheduler, gen_length=gen_length, block_length=block_length, stop_at_eos=stop_at_eos)
    return generate(tiny_llada(seed=7), PROMPTS, config)


@pytest.mark.parametrize("threshold", [0.9, 0.2])
def test_a_window_as_wide_as_the_generation_is_the_threshold_rule_over_one_block(threshold):
    got = decode(DCDScheduler(window=12, max_window=12, threshold=threshold, eos_pad=False))
    want = decode(ThresholdScheduler(threshold), block_length=12)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.nfe, want.nfe)


def test_a_window_of_one_is_left_to_right():
    got = decode(DCDScheduler(window=1, threshold=0.01, eos_pad=False))
    want = decode(LowConfidenceScheduler(), block_length=1)
    assert torch.equal(got.tokens, want.tokens) and got.nfe.tolist() == [12, 12, 12]


def test_the_window_slides_by_what_was_committed():
    rule = DCDScheduler(window=3, max_window=4, threshold=0.5, eos_pad=False)
    state = rule.init_state(1, torch.device("cpu"))
    conf = [[0.9, 0.2, 0.95, 0.99, 0.99, 0.99, 0.99]]
    first, state = rule.select(with_confidence(conf), state)
    assert first.commit[0].tolist() == [True, False, True, False, False, False, False]   # [0, 3)
    masked = [[False, True, False, True, True, True, True]]
    second, state = rule.select(with_confidence(conf, masked=torch.tensor(masked)), state)
    # l = 1; r = 3 + 3 - 1 masked left = 5, capped at l + max_window = 5
    assert second.commit[0].tolist() == [False, False, False, True, True, False, False]
    assert int(state[0]) == 5


def test_an_end_of_text_commit_truncates_the_row():
    got = decode(DCDScheduler(threshold=0.05), stop_at_eos=False)
    eos = tiny_llada(seed=7).eos_token_ids[0]
    for row in got.tokens.tolist():
        if eos in row:
            assert all(t == eos for t in row[row.index(eos):])


@pytest.mark.parametrize("bad, match", [({"window": 0}, "window"), ({"window": 8, "max_window": 4}, "max_window"),
                                        ({"threshold": 0.0}, "threshold"), ({"fixed": -1}, "fixed")])
def test_bad_options_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        DCDScheduler(**bad)
