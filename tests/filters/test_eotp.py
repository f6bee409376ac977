"""EoTP: truncation after the committed (or predicted) end of text, alone and with the loop."""

import dataclasses
import pytest
import torch

from dllm_decode.caches import CACHES
from dllm_decode import DecodeConfig, generate
from dllm_decode.interfaces import Decision
from dllm_decode.testing import OracleMaskPredictor, tiny_llada
from dllm_decode.filters import EoTPFilter, LearnedFilter
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler
from tests.filters.helpers import EOS, make_input

INF = float("inf")


def test_truncates_after_first_committed_eos():
    inp = make_input([[0.9, 0.8, 0.7, 0.6, 0.5]], [[1, EOS, 3, EOS, 5]], block=[[10, 15]], offset=10,
                     gen_end=20)
    out = EoTPFilter()(inp, Decision(commit=torch.tensor([[False, True, False, True, False]])))
    assert out.truncate_at.tolist() == [12]


def test_no_committed_eos_keeps_everything():
    inp = make_input([[0.9, 0.8, 0.7]], [[1, EOS, 3]], block=[[0, 3]], gen_end=8)
    out = EoTPFilter()(inp, Decision(commit=torch.tensor([[True, False, False]])))
    assert out.truncate_at.tolist() == [8]


def test_forced_eos_truncates_in_the_same_step():
    # nothing committed: the loop would force the most confident eligible column (an EOS)
    inp = make_input([[0.2, 0.9, 0.3]], [[1, EOS, 3]], block=[[0, 3]], gen_end=8)
    out = EoTPFilter()(inp, Decision(commit=torch.zeros(1, 3, dtype=torch.bool)))
    assert out.commit.tolist() == [[False, True, False]] and out.truncate_at.tolist() == [2]


def test_rows_truncate_independently():
    inp = make_input([[0.9, 0.8], [0.9, 0.8]], [[EOS, 1], [1, EOS]], block=[[0, 2], [0, 2]], gen_end=6)
    out = EoTPFilter()(inp, Decision(commit=torch.tensor([[True, False], [True, False]])))
    assert out.truncate_at.tolist() == [1, 6]


def test_never_drops_a_position_before_a_committed_eos():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        conf = torch.rand(3, 8, generator=generator)
        conf[torch.rand(3, 8, generator=generator) < 0.3] = -INF           # already committed
        cand = torch.randint(0, 4, (3, 8), generator=generator)
        cand[cand == 3] = EOS
        inp = make_input(conf.tolist(), cand.tolist(), block=[[0, 8]] * 3, gen_end=8)
        commit = torch.rand(3, 8, generator=generator) < 0.4
        out = EoTPFilter()(inp, Decision(commit=commit))
        committed_eos = out.commit & inp.eligible & (cand == EOS)
        cols = torch.arange(8).expand(3, 8)
        first = torch.where(committed_eos, cols, 8).amin(-1)
        assert torch.equal(out.truncate_at, torch.where(first < 8, first + 1, 8))


def test_predicted_mode_cuts_after_most_confident_predicted_eos():
    inp = make_input([[0.9, 0.95, 0.2, 0.97, 0.5]], [[1, EOS, 3, EOS, 5]], block=[[0, 2]], gen_end=5)
    commit = torch.tensor([[True, False, False, False, False]])
    out = EoTPFilter(mode="predicted", eos_threshold=0.9)(inp, Decision(commit=commit))
    assert out.truncate_at.tolist() == [4]              # column 3 (p 0.97) stays, after it is cut
    strict = EoTPFilter(mode="predicted", eos_threshold=0.99)(inp, Decision(commit=commit))
    assert strict.truncate_at.tolist() == [5]


def test_bad_fields_are_rejected():
    with pytest.raises(ValueError, match="mode must be one of"):
        EoTPFilter(mode="eager")
    with pytest.raises(ValueError, match=r"eos_threshold must be in \(0, 1\], got 0"):
        EoTPFilter(eos_threshold=0.0)


def oracle_with_eos_tail(answer: list[int], gen: int, eos_confidence: float, tail_confidence: float):
    """Answer tokens (confidence 0.9), then EOS; the first EOS is very sure, the rest unsure."""
    vocab, mask, eos = 12, 11, 10
    target = torch.tensor(answer + [eos] * (gen - len(answer)))
    confidence = torch.full((gen,), tail_confidence)
    confidence[:len(answer)] = 0.9
    confidence[len(answer)] = eos_confidence
    return OracleMaskPredictor(target, confidence, vocab, mask, eos)


@pytest.mark.parametrize("scheduler", [LowConfidenceScheduler(), ThresholdScheduler()])
def test_same_output_as_without_eotp_when_tail_is_all_eos(scheduler):
    model = oracle_with_eos_tail([1, 2, 3], gen=16, eos_confidence=0.99, tail_confidence=0.3)
    config = DecodeConfig(scheduler, gen_length=16, block_length=8)
    plain = generate(model, [[4, 5]], config)
    eotp = generate(model, [[4, 5]], dataclasses.replace(config, filters=[EoTPFilter()]))
    assert torch.equal(plain.tokens, eotp.tokens)
    assert (eotp.nfe <= plain.nfe).all()


def test_eotp_saves_the_steps_after_the_eos():
    # one token per step; the EOS at column 3 goes first, then 1, 2, 3: four steps instead of eight
    model = oracle_with_eos_tail([1, 2, 3], gen=8, eos_confidence=0.99, tail_confidence=0.3)
    config = DecodeConfig(LowConfidenceScheduler(), gen_length=8, block_length=8)
    assert generate(model, [[4, 5]], config).nfe.tolist() == [8]
    assert generate(model, [[4, 5]], dataclasses.replace(config, filters=[EoTPFilter()])).nfe.tolist() == [4]


def tiny_prompts(n: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, 30, (2 + i % 3,), generator=generator).tolist() for i in range(n)]


def test_batched_equals_one_by_one_with_truncation():
    model = tiny_llada()
    config = DecodeConfig(LowConfidenceScheduler(), gen_length=16, block_length=8)
    eotp = [EoTPFilter(mode="predicted", eos_threshold=0.05)]
    prompts = tiny_prompts(3)
    batched = generate(model, prompts, dataclasses.replace(config, filters=eotp))
    for i, prompt in enumerate(prompts):
        alone = generate(model, [prompt], dataclasses.replace(config, filters=eotp))
        assert torch.equal(batched.tokens[i], alone.tokens[0]) and batched.nfe[i] == alone.nfe[0]


@pytest.mark.parametrize("cache_name", ["prefix", "dual"])
def test_composes_with_block_caches(cache_name, step_weights):
    if cache_name not in CACHES:
        pytest.skip(f"cache {cache_name!r} is not registered yet")
    model = tiny_llada()
    config = DecodeConfig(LowConfidenceScheduler(), gen_length=16, block_length=8)
    filters = [LearnedFilter(weights=step_weights(8), width=8, threshold=0.5),
               EoTPFilter(mode="predicted", eos_threshold=0.05)]
    approximate = generate(model, tiny_prompts(3), dataclasses.replace(config, cache=CACHES[cache_name](), filters=filters))
    assert not (approximate.tokens == model.mask_token_id).any()
    # refreshed every step the cache is exact: truncation must reach it consistently
    exact = generate(model, tiny_prompts(3), dataclasses.replace(config, cache=CACHES[cache_name](refresh_every=1), filters=filters))
    plain = generate(model, tiny_prompts(3), dataclasses.replace(config, filters=filters))
    assert torch.equal(exact.tokens, plain.tokens) and torch.equal(exact.nfe, plain.nfe)
