"""Prophet: finish when the answer region's mean top-1/top-2 logit gap clears the staged bar."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.testing import OracleMaskPredictor
from dllm_decode.schedulers import EarlyCommitScheduler, LowConfidenceScheduler, ThresholdScheduler
from tests.schedulers.inputs import step_input

VOCAB, MASK, EOS = 37, 36, 35


def gaps_view(gaps: list[float], masked: list[bool] | None = None, gen: int | None = None,
              block: tuple[int, int] | None = None):
    """Window [0, len(gaps)); column i has top-1 minus top-2 logit gaps[i]."""
    logits = torch.zeros(1, len(gaps), 6)
    logits[0, :, 1] = torch.tensor(gaps)
    width = len(gaps)
    return step_input(logits, masked=None if masked is None else torch.tensor([masked]),
                      gen_span=[(0, gen or width)], block=[block or (0, width)])


def finishes(scheduler, inp, state=None) -> bool:
    state = scheduler.init_state(1, torch.device("cpu")) if state is None else state
    decision, _ = scheduler.select(inp, state)
    return bool(decision.finish[0])


PROPHET = EarlyCommitScheduler(early=0.25, late=0.5)        # binary cuts: progress is exact


@pytest.mark.parametrize("decoded, bar", [(0, 7.5), (1, 7.5), (2, 5.0), (3, 5.0), (4, 2.5), (7, 2.5)])
def test_staged_bars_switch_at_the_progress_cuts(decoded, bar):
    # generation of 8, `decoded` columns committed: progress decoded / 8, cuts at 0.25 and 0.5
    masked = [False] * decoded + [True] * (8 - decoded)
    assert finishes(PROPHET, gaps_view([bar] * 8, masked))                  # ties pass (>=)
    assert not finishes(PROPHET, gaps_view([bar - 0.01] * 8, masked))


def test_paper_default_cuts():
    masked = [False] * 33 + [True] * 67              # progress 0.33: no longer "< 0.33"
    assert finishes(EarlyCommitScheduler(), gaps_view([5.0] * 100, masked))
    assert not finishes(EarlyCommitScheduler(), gaps_view([5.0] * 100, [False] * 32 + [True] * 68))


def test_gap_is_the_mean_over_the_masked_region_in_logit_units():
    # masked gaps 4 and 8 (mean 6 >= 5.0 at progress 0.25); the committed column's 0 is ignored
    assert finishes(PROPHET, gaps_view([0.0, 4.0, 8.0, 0.0], [False, True, True, False], gen=4,
                                       block=(1, 3)))


def test_masks_past_the_view_count_as_undecoded():
    # view covers 4 of 16 generated columns (dual cache); 2 decoded -> progress 2/16 < 0.25
    masked = [False, False, True, True]
    assert not finishes(PROPHET, gaps_view([7.0] * 4, masked, gen=16))
    assert finishes(PROPHET, gaps_view([7.5] * 4, masked, gen=16))


def eos_tail_view(masked=None):
    """Columns 0-1 predict token 1 with gap 1; columns 2-7 predict EOS (token 2) with gap 10."""
    logits = torch.zeros(1, 8, 6)
    logits[0, :2, 1] = 1.0
    logits[0, 2:, 2] = 10.0
    inp = step_input(logits, masked=None if masked is None else torch.tensor([masked]))
    return dataclasses.replace(inp, eos_ids=(2,))


def test_default_region_leaves_out_the_predicted_end_of_text_padding():
    assert not finishes(PROPHET, eos_tail_view())                        # answer gap 1 < 7.5
    assert finishes(PROPHET, dataclasses.replace(eos_tail_view(), eos_ids=()))  # mean 7.75
    only_tail = eos_tail_view([False, False] + [True] * 6)               # answer written
    assert finishes(PROPHET, only_tail)


def test_explicit_answer_region_and_its_fallback():
    gaps = [0.0, 0.0, 9.0, 9.0, 0.0, 0.0, 0.0, 0.0]
    region = EarlyCommitScheduler(answer_start=2, answer_length=2)
    assert finishes(region, gaps_view(gaps))
    assert not finishes(EarlyCommitScheduler(), gaps_view(gaps))           # mean over all: 2.25
    out_of_view = EarlyCommitScheduler(answer_start=20)
    assert not finishes(out_of_view, gaps_view(gaps))                      # falls back to masked
    assert finishes(out_of_view, gaps_view([9.0] * 8))


def test_a_triggered_row_stays_triggered_and_idle_rows_never_finish():
    state = PROPHET.init_state(1, torch.device("cpu"))
    _, state = PROPHET.select(gaps_view([8.0] * 4), state)
    assert finishes(PROPHET, gaps_view([0.0] * 4), state)                  # next block, dual cache
    idle = gaps_view([9.0] * 4, block=(0, 2), masked=[False, False, True, True])
    assert not finishes(PROPHET, idle)                                    # its block is done


def test_base_decision_is_kept_alongside_finish():
    inp = gaps_view([1.0] * 4)
    decision, _ = EarlyCommitScheduler(base=ThresholdScheduler(0.1)).select(
        inp, EarlyCommitScheduler(base=ThresholdScheduler(0.1)).init_state(1, torch.device("cpu")))
    assert torch.equal(decision.commit, ThresholdScheduler(0.1).select(inp, None)[0].commit)
    assert not decision.finish.any()


def oracle(target, conf):
    return OracleMaskPredictor(torch.tensor(target), torch.tensor(conf), VOCAB, MASK, EOS)


def test_confident_answer_is_filled_in_one_step():
    # p = 0.99 on the target: gap log(35 * 0.99 / 0.01) = 8.15 >= 7.5 at the first step
    target = list(range(1, 13))
    config = DecodeConfig(scheduler=EarlyCommitScheduler(), gen_length=12, block_length=4, stop_at_eos=False)
    result = generate(oracle(target, [0.99] * 12), [[1, 2]], config)
    assert result.tokens[0].tolist() == target and result.nfe.tolist() == [1]


def test_hesitant_answer_commits_once_progress_lowers_the_bar():
    # p = 0.5: gap log 35 = 3.56 clears only the late bar 2.5. One token per step until 9 of 12
    # are decoded (progress 0.75 >= 0.67), then the 10th forward fills the last three.
    target = list(range(1, 13))
    config = DecodeConfig(scheduler=EarlyCommitScheduler(base=LowConfidenceScheduler()), gen_length=12,
                          block_length=4, stop_at_eos=False)
    result = generate(oracle(target, [0.5] * 12), [[1, 2]], config)
    assert result.tokens[0].tolist() == target and result.nfe.tolist() == [10]


@pytest.mark.parametrize("bad, message", [
    (dict(high=1.0), "high >= mid >= low"), (dict(early=0.8), "early <= late"),
    (dict(answer_start=-1), "answer_start"), (dict(answer_length=0), "answer_length"),
])
def test_invalid_fields_are_rejected(bad, message):
    with pytest.raises(ValueError, match=message):
        EarlyCommitScheduler(**bad)
