"""AdaBlock: at a block start, end the block on the most confident predicted delimiter in the window."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dllm_decode import DecodeConfig, generate
from dllm_decode.testing import OracleMaskPredictor, tiny_llada, tiny_tokenizer
from dllm_decode.schedulers import (AdaptiveBlockScheduler, EarlyCommitScheduler, LocalLeapScheduler,
                        delimiter_ids, with_delimiters)
from tests.schedulers.inputs import step_input

VOCAB, MASK, EOS, DELIM = 37, 36, 35, 9


def view(tokens: list[int], conf: list[float], masked=None, start=0, gen=None):
    """Window = canvas columns [0, len); block starts at `start`; probability `conf` on `tokens`."""
    probs = torch.full((1, len(tokens), VOCAB), 0.0)
    for i, (t, c) in enumerate(zip(tokens, conf)):
        probs[0, i] = (1 - c) / (VOCAB - 2)
        probs[0, i, t] = c
        probs[0, i, MASK] = 0.0
    gen = gen or len(tokens)
    return step_input(probs=probs, masked=None if masked is None else torch.tensor([masked]),
                      block=[(start, min(start + 4, gen))], gen_span=[(0, gen)])


def end(scheduler, inp) -> int:
    ends, _ = scheduler.block_end(inp, scheduler.init_state(1, torch.device("cpu")))
    return int(ends[0])


ADA = AdaptiveBlockScheduler(delimiter_ids=(DELIM,), delimiter_threshold=0.3)


def test_block_ends_on_the_most_confident_delimiter_in_the_window():
    # generation 16 -> window 4 columns; delimiters at 1 (0.4) and 3 (0.6)
    inp = view([1, DELIM, 2, DELIM] + [3] * 12, [0.5, 0.4, 0.5, 0.6] + [0.5] * 12)
    assert end(ADA, inp) == 4


def test_delimiter_outside_the_window_or_below_threshold_keeps_the_default_block():
    beyond = view([1, 2, 3, 4, DELIM] + [3] * 11, [0.5, 0.5, 0.5, 0.5, 0.99] + [0.5] * 11)
    assert end(ADA, beyond) == 4                         # column 4 is just past the 25% window
    weak = view([DELIM] + [3] * 15, [0.29] + [0.5] * 15)
    assert end(ADA, weak) == 4
    assert end(AdaptiveBlockScheduler(delimiter_ids=(DELIM,), delimiter_threshold=0.29), weak) == 1
    assert end(AdaptiveBlockScheduler(delimiter_ids=(DELIM,), delimiter_threshold=float("inf")),
               view([DELIM] * 16, [1.0] * 16)) == 4


def test_ties_go_left_and_committed_delimiters_do_not_count():
    inp = view([DELIM, DELIM, DELIM] + [3] * 13, [0.7, 0.9, 0.9] + [0.5] * 13)
    assert end(ADA, inp) == 2
    committed = view([DELIM, DELIM, DELIM] + [3] * 13, [0.7, 0.9, 0.9] + [0.5] * 13,
                     masked=[True, False, False] + [True] * 13)
    assert end(ADA, committed) == 1


def test_window_starts_at_the_block_and_is_capped_by_the_generation_end():
    # block starts at 12 of 16: window [12, 16); a delimiter at 15 ends the last block there
    inp = view([3] * 15 + [DELIM], [0.5] * 15 + [0.8], start=12)
    assert end(ADA, inp) == 16


def test_no_delimiter_ids_means_fixed_blocks():
    assert end(AdaptiveBlockScheduler(), view([DELIM] * 16, [1.0] * 16)) == 4


def oracle(target, conf):
    return OracleMaskPredictor(torch.tensor(target), torch.tensor(conf), VOCAB, MASK, EOS)


def block_starts(result) -> list[int]:
    return [step["offset"] for step in result.trace if step["block_step"] == 0]


def test_adaptive_blocks_need_not_divide_the_generation_length():
    # gen 10 (window 2), default block 4: delimiters at 1 and 3 -> [0, 2), [2, 4), then the
    # default [4, 8) and a last block cut to [8, 10) by the generation end
    target = [1, DELIM, 2, DELIM, 5, 6, 7, 8, 10, 11]
    config = DecodeConfig(scheduler=ADA, gen_length=10, block_length=4, stop_at_eos=False)
    result = generate(oracle(target, [0.95] * 10), [[1, 2]], config, trace=True)
    assert result.tokens[0].tolist() == target
    assert block_starts(result) == [0, 2, 4, 8]
    assert result.nfe.tolist() == [4]                    # every block in one threshold step


def test_adaptive_blocks_batched_equal_one_by_one():
    # token 33 is predicted at different places per row, so rows get different block bounds
    model = tiny_llada(seed=4)
    scheduler = AdaptiveBlockScheduler(delimiter_ids=(33,), delimiter_threshold=0.0,
                                       base=LocalLeapScheduler())
    config = DecodeConfig(scheduler=scheduler, gen_length=12, block_length=5)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    batched = generate(model, prompts, config)
    assert not (batched.tokens == MASK).any()
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], config)
        assert torch.equal(batched.tokens[row], alone.tokens[0]) and batched.nfe[row] == alone.nfe[0]


def newline_tokenizer():
    core = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "\n": 2, ".": 3}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split("\n", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")


def test_delimiter_ids_come_from_the_tokenizer():
    assert delimiter_ids(newline_tokenizer()) == (2,)
    assert delimiter_ids(newline_tokenizer(), chars=("\n", ".")) == (2, 3)
    assert delimiter_ids(tiny_tokenizer()) == ()         # whitespace-split word vocabulary


def test_with_delimiters_fills_nested_empty_fields_only():
    wrapped = EarlyCommitScheduler(base=AdaptiveBlockScheduler())
    assert with_delimiters(wrapped, newline_tokenizer()).base.delimiter_ids == (2,)
    explicit = AdaptiveBlockScheduler(delimiter_ids=(7,))
    assert with_delimiters(explicit, newline_tokenizer()) is explicit
    assert with_delimiters(wrapped, None) is wrapped
    assert wrapped.chooses_block_bounds and wrapped.view == "rest"


@pytest.mark.parametrize("bad, message", [
    (dict(delimiter_threshold=-1.0), r"delimiter_threshold is a probability bar: it must be in \[0, 1\] or inf \(never\), got -1.0"),
    (dict(window=0.0), "window must be in"), (dict(delimiter_ids=(-1,)), "delimiter_ids"),
])
def test_invalid_fields_are_rejected(bad, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveBlockScheduler(**bad)
