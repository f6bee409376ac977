"""`wino`: wide-in commits, narrow-out re-masks, their caps and tie rules, by hand and in the loop."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_decode import DecodeConfig, generate
from dllm_decode.caches import CACHES
from dllm_decode.registry import component
from dllm_decode.schedulers import CreditScheduler, EarlyCommitScheduler, WinoScheduler
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import rows, step_input

VOCAB, MASK, EOS = 8, 7, 6


def view(p_top: list[float], top: list[int], current: list[int], masked: list[bool], step: int = 1):
    """One row: column i's argmax is `top[i]` with probability `p_top[i]` (the rest spread evenly);
    committed columns hold `current[i]` and are revisable."""
    probs = torch.zeros(1, len(p_top), VOCAB)
    for i, (p, t) in enumerate(zip(p_top, top)):
        probs[0, i] = (1 - p) / (VOCAB - 2)
        probs[0, i, MASK] = 0.0
        probs[0, i, t] = p
    mask = torch.tensor([masked])
    inp = step_input(probs=probs, masked=mask, step=step)
    current = torch.tensor([[MASK if m else c for c, m in zip(current, masked)]])
    return dataclasses.replace(inp, current=current, revisable=~mask)


def test_wide_in_bar_is_strict():
    decision, _ = WinoScheduler(threshold=0.7).select(
        view([0.7, 0.71, 0.5, 0.9], [1, 2, 3, 4], [0] * 4, [True] * 4), None)
    assert decision.commit[0].tolist() == [False, True, False, True]      # 0.7 is not > 0.7
    assert not decision.remask.any()                                      # nothing committed yet


def test_narrow_out_remasks_the_lowest_failing_tokens_up_to_commits_minus_one():
    # masked 0-2: two clear 0.7 (|A| = 2, so one re-mask is allowed); committed 3-5:
    # 3 scores exactly 0.9 (stays: `<` is strict), 4 scores 0.5, 5's argmax is another token
    # (its current token scores 0.05 / 6), the lowest: only 5 goes back
    inp = view([0.8, 0.95, 0.3, 0.9, 0.5, 0.95], [1, 2, 3, 1, 2, 4], [0, 0, 0, 1, 2, 3],
               [True, True, True, False, False, False])
    decision, _ = WinoScheduler().select(inp, None)
    assert decision.commit[0].tolist() == [True, True, False, False, False, False]
    assert decision.remask[0].tolist() == [False, False, False, False, False, True]
    # with three commits both failing tokens go back, the one at the bar still stays
    more = view([0.8, 0.95, 0.75, 0.9, 0.5, 0.95], [1, 2, 3, 1, 2, 4], [0, 0, 0, 1, 2, 3],
                [True, True, True, False, False, False])
    assert WinoScheduler().select(more, None)[0].remask[0].tolist() == [False] * 4 + [True, True]


def test_no_narrow_out_after_a_single_accept():
    inp = view([0.8, 0.3, 0.1], [1, 2, 3], [0, 0, 4], [True, True, False])
    decision, _ = WinoScheduler().select(inp, None)
    assert decision.commit[0].tolist() == [True, False, False] and not decision.remask.any()
    # nothing clears the bar: the loop forces one commit, so still no re-mask
    low = view([0.2, 0.3, 0.1], [1, 2, 3], [0, 0, 4], [True, True, False])
    decision, _ = WinoScheduler().select(low, None)
    assert not decision.commit.any() and not decision.remask.any()


def test_accept_cap_follows_the_reference_formula():
    rule = WinoScheduler(threshold=0.5)
    assert rule.accept_cap(torch.tensor([1, 4, 8, 12, 28, 30, 128])).tolist() == [5, 5, 5, 8, 19, 20, 20]
    assert WinoScheduler(max_accept=0).accept_cap(torch.tensor([3, 40])).tolist() == [3, 40]
    # 12 masked, all above the bar: the 8 most confident commit
    p = [0.90 + 0.005 * i for i in range(12)]
    decision, _ = rule.select(view(p, [1] * 12, [0] * 12, [True] * 12), None)
    assert decision.commit[0].tolist() == [False] * 4 + [True] * 8
    uncapped, _ = WinoScheduler(threshold=0.5, max_accept=0).select(view(p, [1] * 12, [0] * 12, [True] * 12), None)
    assert uncapped.commit.all()


def test_reference_cap_keeps_last_accept_minus_one_once_that_many_fail():
    # 4 commits; committed 4-6 all fail (scores 0.5, 0.4, 0.3)
    p, masked = [0.95] * 4 + [0.5, 0.4, 0.3], [True] * 4 + [False] * 3
    inp = view(p, [1] * 7, [0, 0, 0, 0, 1, 1, 1], masked, step=1)
    default, _ = WinoScheduler().select(inp, torch.tensor([2]))
    assert default.remask[0].tolist() == [False] * 4 + [True] * 3            # |A| - 1 = 3 allowed
    reference, last = WinoScheduler(reference_cap=True).select(inp, torch.tensor([2]))
    assert reference.remask[0].tolist() == [False] * 6 + [True]              # last accept 2 -> 1
    assert last.tolist() == [4]
    # at a block start the previous block's count is forgotten (30), so all three fail
    start = dataclasses.replace(inp, step=0)
    assert WinoScheduler(reference_cap=True).select(start, torch.tensor([2]))[0].remask.sum() == 3


def test_rows_decide_independently():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 9, VOCAB, generator=g) * 3
    masked = torch.rand(3, 9, generator=g) < 0.6
    inp = step_input(logits, masked=masked, step=1)
    inp = dataclasses.replace(inp, current=torch.where(masked, MASK, logits.argmax(-1)), revisable=~masked)
    rule = WinoScheduler(threshold=0.5, threshold_back=0.95)
    batched, _ = rule.select(inp, torch.tensor([3, 1, 2]))
    for row in range(3):
        alone, _ = rule.select(rows(inp, [row]), torch.tensor([[3, 1, 2][row]]))
        assert torch.equal(batched.commit[row], alone.commit[0])
        assert torch.equal(batched.remask[row], alone.remask[0])


def test_defaults_registry_and_validation():
    rule = WinoScheduler()
    assert (rule.threshold, rule.threshold_back, rule.accept_ratio, rule.min_accept, rule.max_accept,
            rule.reference_cap) == (0.7, 0.9, 0.7, 5, 20, False)
    assert WinoScheduler.revises == "block"
    assert component("scheduler", {"name": "wino", "threshold": "0.5", "threshold_back": "0.8"}) == \
        WinoScheduler(threshold=0.5, threshold_back=0.8)
    for bad in (dict(threshold=1.0), dict(threshold_back=1.5), dict(accept_ratio=0.0),
                dict(min_accept=0), dict(max_accept=-1)):
        with pytest.raises(ValueError):
            WinoScheduler(**bad)


class ChangesItsMind(torch.nn.Module):
    """Scripted by the number of masks left in the 4-column generation (the canvas tail):
    4 masks: columns 0, 1 sure of 3, 4 (0.95), columns 2, 3 unsure (0.3);
    2 masks: column 1 now prefers token 2 (0.8; its committed 4 scores 0.04), columns 2, 3 sure;
    1 mask:  column 1 is sure of 4 again."""

    supports_kv = False

    def __init__(self):
        super().__init__()
        self.mask_token_id, self.eos_token_ids, self.vocab_size, self.max_length = MASK, (EOS,), VOCAB, None

    def forward(self, input_ids, attention_mask=None, positions=None, kv=None, rows=None):
        gen = input_ids[:, -4:]
        left = (gen == MASK).sum(-1)
        top = torch.tensor([3, 4, 5, 6]).expand_as(gen).clone()
        p = torch.full(gen.shape, 0.95)
        p[left == 4, 2:] = 0.3
        top[left == 2, 1], p[left == 2, 1] = 2, 0.8
        probs = ((1 - p) / (VOCAB - 2)).unsqueeze(-1).repeat(1, 1, VOCAB)
        probs.scatter_(-1, top.unsqueeze(-1), p.unsqueeze(-1))
        probs[..., MASK] = 0.0
        logits = torch.zeros(*input_ids.shape, VOCAB)
        logits[:, -4:] = probs.log()
        a, b = rows if rows is not None else (0, input_ids.shape[1])
        return logits[:, a:b]


def test_the_loop_takes_back_a_token_the_model_stops_supporting():
    config = DecodeConfig(scheduler=WinoScheduler(), gen_length=4, block_length=4, stop_at_eos=False)
    result = generate(ChangesItsMind(), [[1, 2]], config, trace=True)
    assert result.tokens[0].tolist() == [3, 4, 5, 6] and result.nfe.tolist() == [3]
    assert [s["commit"][0].int().tolist() for s in result.trace] == [[1, 1, 0, 0], [0, 0, 1, 1], [0, 1, 0, 0]]
    assert [s["remask"][0].int().tolist() for s in result.trace] == [[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    # a rule that never takes back keeps the token the model stopped supporting
    strict = DecodeConfig(scheduler=WinoScheduler(threshold_back=0.0), gen_length=4, block_length=4,
                          stop_at_eos=False)
    assert generate(ChangesItsMind(), [[1, 2]], strict).nfe.tolist() == [2]


class RandomLogits(torch.nn.Module):
    """Cheap random model: logits from each column's token, its position and the row's mask count,
    so predictions at committed columns move as the canvas fills (re-masks happen)."""

    supports_kv = False

    def __init__(self, seed: int, scale: float, vocab: int = 9):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.mask_token_id, self.eos_token_ids, self.vocab_size, self.max_length = vocab - 1, (vocab - 2,), vocab, None
        self.by_token = torch.randn(vocab, vocab, generator=g) * scale
        self.by_position = torch.randn(64, vocab, generator=g) * scale
        self.by_count = torch.randn(64, vocab, generator=g) * scale

    def forward(self, input_ids, attention_mask=None, positions=None, kv=None, rows=None):
        count = (input_ids == self.mask_token_id).sum(-1, keepdim=True)
        logits = (self.by_token[input_ids] + self.by_position[:input_ids.shape[1]]
                  + self.by_count[count.expand_as(input_ids) % 64])
        a, b = rows if rows is not None else (0, input_ids.shape[1])
        return logits[:, a:b]


@settings(max_examples=1500, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), scale=st.sampled_from([0.5, 2.0, 5.0]),
       gen=st.sampled_from([4, 8, 12, 16]), block=st.sampled_from([2, 4, 8]), batch=st.integers(1, 3),
       tau1=st.sampled_from([0.0, 0.3, 0.7, 0.95]), tau2=st.sampled_from([0.5, 0.9, 1.0]),
       reference_cap=st.booleans(), max_accept=st.sampled_from([0, 2, 20]))
def test_random_logits_always_terminate_with_no_mask(seed, scale, gen, block, batch, tau1, tau2,
                                                      reference_cap, max_accept):
    if gen % block:
        block = 2
    model = RandomLogits(seed % 1000, scale)
    rule = WinoScheduler(threshold=tau1, threshold_back=tau2, reference_cap=reference_cap, max_accept=max_accept)
    prompts = [[1 + (seed + i) % 5, 2, 3][: 1 + i] for i in range(batch)]
    config = DecodeConfig(scheduler=rule, gen_length=gen, block_length=block, stop_at_eos=False)
    result = generate(model, prompts, config, trace=True)
    assert not (result.tokens == model.mask_token_id).any()
    assert int(result.nfe.max()) <= gen                   # one mask fewer per step, at least
    for step in result.trace:
        assert not (step["commit"] & step["remask"]).any()
        assert (step["remask"].sum(-1) <= (step["commit"].sum(-1) - 1).clamp_min(0)).all()


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_decodes_under_each_cache_and_batched_equals_one_by_one(cache):
    model, prompts = tiny_llada(seed=4), [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    config = DecodeConfig(scheduler=WinoScheduler(threshold=0.1, threshold_back=0.99), cache=CACHES[cache](),
                          gen_length=16, block_length=8, stop_at_eos=False)
    batched = generate(model, prompts, config, trace=True)
    assert not (batched.tokens == model.mask_token_id).any()
    assert sum(int(s["remask"].sum()) for s in batched.trace) > 0, "the case exercises re-masking"
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], config)
        assert torch.equal(alone.tokens[0], batched.tokens[row]) and alone.nfe[0] == batched.nfe[row]


@pytest.mark.parametrize("wrapper", [CreditScheduler, EarlyCommitScheduler])
def test_composes_with_wrappers(wrapper):
    rule = wrapper(base=WinoScheduler(threshold=0.3, threshold_back=0.95))
    assert rule.revises == "block"
    model, prompts = tiny_llada(seed=4), [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    for cache in ("none", "dual"):
        config = DecodeConfig(scheduler=rule, cache=CACHES[cache](), gen_length=16, block_length=8,
                              stop_at_eos=False)
        batched = generate(model, prompts, config)
        assert not (batched.tokens == model.mask_token_id).any() and (batched.nfe <= 16).all()
        alone = generate(model, prompts[1:2], config)
        assert torch.equal(alone.tokens[0], batched.tokens[1])


def test_cli_builds_it_by_name_with_options_and_as_a_wrapper_base():
    """(`eval` also takes `--scheduler wino:threshold=0.5`, through the same `component`.)"""
    from click.testing import CliRunner

    from dllm_decode.cli import main

    base = ["--model", "tiny", "--gen-length", "8", "--block-length", "4", "--prompt", "w1 w2", "--json"]
    for args, wanted in ((["--scheduler", "wino", "-o", "threshold=0.5", "-o", "threshold_back=0.8"], (0.5, 0.8)),
                         (["--scheduler", "credit", "-o", "base=wino", "-o", "base.threshold=0.6"], (0.6, 0.9))):
        result = CliRunner().invoke(main, [*base, *args])
        assert result.exit_code == 0, result.output
        scheduler = json.loads(result.output)["config"]["scheduler"]
        scheduler = scheduler.get("base", scheduler)
        assert scheduler["name"] == "wino" and (scheduler["threshold"], scheduler["threshold_back"]) == wanted
