"""The oracle: commit what matches the reference; on a stall one reference token, counted."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.testing import OracleMaskPredictor, tiny_llada
from dllm_decode.schedulers import LowConfidenceScheduler, OracleScheduler, oracle_reference
from tests.schedulers.inputs import step_input

VOCAB, MASK, EOS = 37, 36, 35


def decide(oracle, inp):
    return oracle.select(inp, oracle.init_state(inp.live.shape[0], torch.device("cpu")))[0]


def candidates_view(tokens: list[int], conf: list[float], gen_start: int = 0):
    probs = torch.full((1, len(tokens), 8), 0.0)
    for i, (t, c) in enumerate(zip(tokens, conf)):
        probs[0, i] = (1 - c) / 7
        probs[0, i, t] = c
    return step_input(probs=probs, offset=gen_start,
                      gen_span=[(gen_start, gen_start + len(tokens))])


def test_commits_exactly_the_matching_positions():
    inp = candidates_view([1, 2, 3, 4], [0.5, 0.9, 0.6, 0.7])
    decision = decide(OracleScheduler(reference=((1, 5, 3, 5),)), inp)
    assert decision.commit[0].tolist() == [True, False, True, False]


@pytest.mark.parametrize("on_stall, position", [("confident", 3), ("leftmost", 0)])
def test_a_stall_commits_one_reference_token(on_stall, position):
    inp = candidates_view([1, 2, 3, 4], [0.5, 0.6, 0.7, 0.9])
    decision = decide(OracleScheduler(reference=((6, 6, 6, 7),), on_stall=on_stall), inp)
    assert decision.commit[0].nonzero().flatten().tolist() == [position]
    assert int(decision.tokens[0, position]) == (7 if position == 3 else 6)


def test_reference_is_indexed_from_the_generation_start():
    inp = candidates_view([1, 2], [0.5, 0.6], gen_start=5)
    assert decide(OracleScheduler(reference=((1, 9),)), inp).commit[0].tolist() == [True, False]


def test_reference_rows_must_fit_the_batch():
    with pytest.raises(ValueError, match="reference has 2 rows; the batch has 3"):
        OracleScheduler(reference=((1,), (2,))).init_state(3, torch.device("cpu"))
    with pytest.raises(ValueError, match="same length"):
        OracleScheduler(reference=((1,), (2, 3)))
    with pytest.raises(ValueError, match="on_stall"):
        OracleScheduler(on_stall="random")


def oracle_model(target, conf):
    return OracleMaskPredictor(torch.tensor(target), torch.tensor(conf), VOCAB, MASK, EOS)


def test_end_to_end_with_the_models_own_output_takes_one_step_per_block():
    model = oracle_model([3, 4, 5, 6, 7, 8, 9, 10], [0.3] * 8)
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=8, block_length=4, stop_at_eos=False)
    reference = oracle_reference(model, [[1, 2]], config)
    result = generate(model, [[1, 2]], dataclasses.replace(config, scheduler=OracleScheduler.from_reference(reference)))
    assert torch.equal(result.tokens, reference)
    assert result.nfe.tolist() == [2]                     # vs 8 one token per step


def test_end_to_end_stalls_are_counted_and_the_output_is_the_reference():
    # the model never predicts reference tokens 9 at columns 1 and 3: two counted stall steps
    model = oracle_model([3, 4, 5, 6], [0.3, 0.9, 0.3, 0.5])
    oracle = OracleScheduler(reference=((3, 9, 5, 9),))
    result = generate(model, [[1, 2]], DecodeConfig(scheduler=oracle, gen_length=4, block_length=4,
                                                    stop_at_eos=False), trace=True)
    assert result.tokens[0].tolist() == [3, 9, 5, 9]
    assert [step["commit"][0].nonzero().flatten().tolist() for step in result.trace] == [[0, 2], [1], [3]]
    assert result.nfe.tolist() == [3]


def test_oracle_reproduces_the_baseline_in_no_more_steps_batched():
    model = tiny_llada(seed=6)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=8, block_length=4)
    baseline = generate(model, prompts, config)
    reference = oracle_reference(model, prompts, config)
    assert torch.equal(reference, baseline.tokens)
    oracle = generate(model, prompts, dataclasses.replace(config, scheduler=OracleScheduler.from_reference(reference)))
    assert torch.equal(oracle.tokens, baseline.tokens)
    assert (oracle.nfe <= baseline.nfe).all()


def test_without_reference_it_is_one_token_per_step_low_confidence():
    model = tiny_llada(seed=6)
    config = DecodeConfig(scheduler=OracleScheduler(), gen_length=8, block_length=4)
    plain = generate(model, [[1, 2]], dataclasses.replace(config, scheduler=LowConfidenceScheduler()))
    alone = generate(model, [[1, 2]], config)
    assert torch.equal(alone.tokens, plain.tokens) and torch.equal(alone.nfe, plain.nfe)
