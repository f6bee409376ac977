"""`info_gain`: its look-ahead (built, run and counted by the loop), scores, paths and refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.caches import CACHES
from dllm_decode.consult import lookahead_entropy
from dllm_decode.schedulers import InfoGainScheduler, LowConfidenceScheduler
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import step_input

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]


@pytest.fixture(scope="module")
def model():
    return tiny_llada(seed=5)


class Counting(torch.nn.Module):
    """Counts forward calls and the canvas rows they process."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls, self.rows = inner, 0, 0
        for name in ("mask_token_id", "eos_token_ids", "vocab_size", "max_length", "supports_kv"):
            setattr(self, name, getattr(inner, name))

    def forward(self, input_ids, *args, **kwargs):
        self.calls += 1
        self.rows += input_ids.shape[0]
        return self.inner(input_ids, *args, **kwargs)


def run(model, scheduler, prompts=PROMPTS, **kw):
    config = DecodeConfig(scheduler, gen_length=16, block_length=8, stop_at_eos=False, **kw)
    return generate(model, prompts, config, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("settings", [dict(candidates=1), dict(position_temperature=0.0)])
def test_without_candidates_it_is_low_confidence_top1_with_no_lookahead(model, settings):
    got = run(model, InfoGainScheduler(bypass_threshold=0.0, **settings))
    want = run(model, LowConfidenceScheduler())
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.nfe, want.nfe)
    assert torch.equal(got.forward_rows, got.nfe)


def test_every_lookahead_call_is_counted_in_nfe_and_every_candidate_in_forward_rows(model):
    counting = Counting(model)
    result = generate(counting, [[1, 2, 3]], DecodeConfig(InfoGainScheduler(), gen_length=16,
                                                          block_length=8, stop_at_eos=False))
    assert int(result.nfe[0]) == counting.calls
    assert int(result.forward_rows[0]) == counting.rows
    assert counting.rows > counting.calls > 16            # look-aheads ran, with several candidates
    # one token per step: 16 base forwards, and a look-ahead in every step with > 1 eligible column
    assert counting.calls == 16 + 2 * 7


def test_batched_rows_take_one_lookahead_call_and_equal_one_by_one(model):
    batched = run(model, InfoGainScheduler())
    for row, prompt in enumerate(PROMPTS):
        alone = run(model, InfoGainScheduler(), prompts=[prompt])
        assert torch.equal(batched.tokens[row], alone.tokens[0])
        assert batched.nfe[row] == alone.nfe[0] and batched.forward_rows[row] == alone.forward_rows[0]


def test_sampled_decodes_repeat(model):
    a, b = (run(model, InfoGainScheduler(), temperature=1.0) for _ in range(2))
    assert torch.equal(a.tokens, b.tokens)


def _view(confidence: list[float], masked: list[bool] | None = None):
    probs = torch.full((1, len(confidence), 6), 0.0)
    for i, c in enumerate(confidence):
        probs[0, i, 1:5] = (1 - c) / 4
        probs[0, i, 0] = c
    masked = torch.tensor([masked or [True] * len(confidence)])
    inp = step_input(probs=probs, masked=masked, generator=torch.Generator().manual_seed(3))
    return dataclasses.replace(inp, current=torch.where(masked, 5, 0), mask_id=5)


def test_bypass_fires_iff_every_masked_block_column_passes():
    rule = InfoGainScheduler(bypass_threshold=0.8)
    inp = _view([0.9, 0.85, 0.8])
    assert rule.select(inp, None)[0].commit[0].tolist() == [True, True, True]
    inp = _view([0.9, 0.85, 0.79])
    actions, _, state = rule.lookahead(inp, None)
    assert actions.any()                                   # one column below: no bypass
    assert rule.select(inp, state)[0].commit.sum() == 1


def test_candidate_zero_is_greedy_and_ties_pick_it():
    rule = InfoGainScheduler(bypass_threshold=0.0, candidates=4, position_temperature=5.0)
    inp = _view([0.3, 0.6, 0.3, 0.3])
    actions, tokens, state = rule.lookahead(inp, None)
    assert actions[0, 0].tolist() == [False, True, False, False]
    assert torch.equal(tokens[0, 0], inp.candidates[0])
    first = actions.any(-1)[0]
    positions = actions[0].int().argmax(-1)[first]
    assert len(set(positions.tolist())) == int(first.sum())          # distinct actions only
    # every candidate leaves the same future: J ties on the future term, and the cost (the
    # entropy at the column) is lowest at the most confident column: candidate 0 wins
    same = dataclasses.replace(inp, lookahead_entropy=torch.ones(1, 4, 4))
    assert rule.select(same, state)[0].commit[0].tolist() == [False, True, False, False]


def test_the_candidate_with_the_least_uncertain_future_wins():
    rule = InfoGainScheduler(bypass_threshold=0.0, candidates=8, position_temperature=100.0)
    inp = _view([0.5, 0.5, 0.5, 0.5, 0.5])
    actions, _, state = rule.lookahead(inp, None)
    assert actions.any(-1)[0].sum() >= 2
    last = int(actions.any(-1)[0].nonzero()[-1])
    future = torch.full((1, 8, 5), 2.0)
    future[0, last] = 0.5
    picked = rule.select(dataclasses.replace(inp, lookahead_entropy=future), state)[0].commit
    assert torch.equal(picked[0], actions[0, last])
    # lookum ignores the cost term; info_gain with a heavy cost weight still ties on cost here
    lookum = dataclasses.replace(rule, variant="lookum", cost_weight=100.0)
    assert torch.equal(lookum.select(dataclasses.replace(inp, lookahead_entropy=future), state)[0].commit,
                       picked)


def test_lookum_ignores_the_cost():
    inp = _view([0.9, 0.3, 0.3])
    rule = InfoGainScheduler(bypass_threshold=0.0, candidates=8, position_temperature=100.0,
                             variant="lookum")
    actions, _, state = rule.lookahead(inp, None)
    columns = actions[0].int().argmax(-1)
    future = torch.where(columns == 0, 1.0, 0.5).view(1, 8, 1).expand(1, 8, 3).clone()
    future[0, ~actions.any(-1)[0]] = float("inf")
    commit = rule.select(dataclasses.replace(inp, lookahead_entropy=future), state)[0].commit
    assert not commit[0, 0]                               # lower cost at column 0, worse future
    heavy = dataclasses.replace(rule, variant="info_gain", cost_weight=100.0)
    assert heavy.select(dataclasses.replace(inp, lookahead_entropy=future), state)[0].commit[0, 0]


def test_lookahead_entropy_builds_each_candidate_canvas(model):
    canvas = torch.tensor([[1, 2, 36, 36, 36]])
    actions = torch.tensor([[[True, False, False], [False, False, True]]])
    tokens = torch.tensor([[[7, 7, 7], [9, 9, 9]]])
    entropy = lookahead_entropy(model, canvas, None, 2, actions, tokens, 36)
    assert entropy.shape == (1, 2, 3)
    assert torch.isinf(entropy[0, 0, 0]) and torch.isfinite(entropy[0, 0, 1:]).all()
    assert torch.isinf(entropy[0, 1, 2]) and torch.isfinite(entropy[0, 1, :2]).all()
    # candidate 1's canvas run alone gives the same entropies
    alone = model(torch.tensor([[1, 2, 36, 36, 9]]), None, rows=(2, 5)).float()
    alone[..., 36] = torch.finfo(torch.float32).min
    logp = alone.log_softmax(-1)
    want = -(logp.exp() * logp).sum(-1)[0, :2]
    torch.testing.assert_close(entropy[0, 1, :2], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_refused_under_block_caches_in_one_line(cache):
    with pytest.raises(ValueError, match=r"only under the caches \['none', 'block'\].*use cache 'none'") as err:
        DecodeConfig(InfoGainScheduler(), cache=CACHES[cache]())
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("field, value", [("candidates", 0), ("position_temperature", -1.0),
                                          ("bypass_threshold", 1.5), ("variant", "x"),
                                          ("cost", "max"), ("future_scope", "row")])
def test_bad_settings_are_refused_in_one_line(field, value):
    with pytest.raises(ValueError, match=field):
        InfoGainScheduler(**{field: value})


def test_block_scope_decodes(model):
    result = run(model, InfoGainScheduler(future_scope="block", cost="mean"))
    assert not (result.tokens == model.mask_token_id).any()


def test_other_rules_count_one_row_per_forward_and_no_guide(model):
    from dllm_decode.schedulers import ThresholdScheduler

    result = run(model, ThresholdScheduler())
    assert torch.equal(result.forward_rows, result.nfe) and not result.guide_nfe.any()


def test_a_wrapper_passes_the_look_ahead_and_its_cache_refusal_through(model):
    from dllm_decode.schedulers import EarlyCommitScheduler

    wrapped = EarlyCommitScheduler(base=InfoGainScheduler())
    assert wrapped.lookahead_candidates == 8 and wrapped.caches == ("none", "block")
    with pytest.raises(ValueError, match="use cache 'none'"):
        DecodeConfig(wrapped, cache=CACHES["prefix"]())
    counting = Counting(model)
    result = generate(counting, [[1, 2, 3]], DecodeConfig(wrapped, gen_length=16, block_length=8,
                                                          stop_at_eos=False))
    assert int(result.nfe[0]) == counting.calls and int(result.forward_rows[0]) == counting.rows
    assert result.forward_rows[0] > result.nfe[0]
