"""`remdm` (ReMDM's LLaDA count form) and the loop's step budget it runs under."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.caches import CACHES
from dllm_decode.interfaces import Decision, Scheduler
from dllm_decode.schedulers import LowConfidenceScheduler, ReMDMScheduler
from dllm_decode.testing import tiny_llada
from tests.schedulers.inputs import step_input

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]


@pytest.fixture(scope="module")
def model():
    return tiny_llada(seed=5)


def run(model, scheduler, prompts=PROMPTS, gen=16, block=8, **kw):
    config = DecodeConfig(scheduler, gen_length=gen, block_length=block, stop_at_eos=False, **kw)
    return generate(model, prompts, config, generator=torch.Generator().manual_seed(0), trace=True)


@pytest.mark.parametrize("steps, loop", [(0, 1), (0, 3), (4, 2), (2, 0)])
def test_nfe_per_block_is_ordinary_steps_plus_loop_steps_and_no_mask_is_left(model, steps, loop):
    result = run(model, ReMDMScheduler(steps_per_block=steps, loop_steps=loop))
    per_block = (steps or 8) + loop
    assert result.nfe.tolist() == [2 * per_block] * 3
    assert not (result.tokens == model.mask_token_id).any()


def test_loop_steps_make_no_net_progress_and_remask_only_committed_block_columns(model):
    scheduler = ReMDMScheduler(loop_steps=3, loop_number=2)
    result = run(model, scheduler, prompts=[[1, 2, 3]])
    ordinary, insert = scheduler.plan(8)
    loops = [e for e in result.trace if insert < e["block_step"] < insert + scheduler.loop_steps]
    assert loops                                          # loop steps that are followed by another
    for entry in loops:       # commits 2 and takes 2 back (or does not commit its 2 least sure)
        assert entry["commit"].sum() == entry["remask"].sum() <= 2
    for entry in result.trace:
        assert (entry["offset"] >= 0) and not (entry["remask"] & entry["commit"]).any()
        # the window under the `none` cache starts at the block start: every re-mask is in it
        assert entry["remask"].shape == entry["commit"].shape


def test_loop_steps_zero_is_low_confidence(model):
    for steps in (0, 4):
        got = run(model, ReMDMScheduler(steps_per_block=steps, loop_steps=0))
        want = run(model, LowConfidenceScheduler(steps_per_block=steps or None))
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.nfe, want.nfe)


def test_the_loop_step_re_predicts_the_least_confident_commit():
    # step k* of a 4-column block (k* = 3, the last ordinary step): columns 0-2 committed with
    # confidences at commit 0.9, 0.4, 0.8; column 3 commits now at 0.95: column 1 goes back
    scheduler = ReMDMScheduler(loop_steps=1)
    probs = torch.full((1, 4, 5), 0.01)
    probs[0, :, 0] = torch.tensor([0.9, 0.4, 0.8, 0.95])
    masked = torch.tensor([[False, False, False, True]])
    inp = step_input(probs=probs, masked=masked, step=3, num_steps=4)
    inp = dataclasses.replace(inp, current=torch.tensor([[0, 0, 0, 4]]), revisable=~masked)
    state = (torch.tensor([[0.9, 0.4, 0.8, float("inf")]]), torch.tensor([0]))
    decision, _ = scheduler.select(inp, state)
    assert decision.commit[0].tolist() == [False, False, False, True]
    assert decision.remask[0].tolist() == [False, True, False, False]
    # the new commit is the least confident: it is not committed (the next forward sees it masked)
    probs[0, 3, 0] = 0.1
    inp = dataclasses.replace(step_input(probs=probs, masked=masked, step=3, num_steps=4),
                              current=torch.tensor([[0, 0, 0, 4]]), revisable=~masked)
    decision, _ = scheduler.select(inp, state)
    assert not decision.commit.any() and not decision.remask.any()


def test_fewer_committed_than_loop_number_never_touches_uncommitted_columns():
    """The port's `topk` over +inf entries re-masked prompt or masked columns; here only
    committed block columns are candidates."""
    scheduler = ReMDMScheduler(steps_per_block=2, loop_steps=1, loop_number=5)
    probs = torch.full((1, 6, 5), 0.01)
    probs[0, :, 0] = 0.5
    masked = torch.tensor([[True, True, True, True, False, True]])
    inp = step_input(probs=probs, masked=masked, step=1, num_steps=6, block=[(0, 6)])
    inp = dataclasses.replace(inp, current=torch.tensor([[4, 4, 4, 4, 0, 4]]), revisable=~masked)
    decision, _ = scheduler.select(inp, None)
    assert not (decision.remask & ~inp.revisable).any()


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_runs_under_block_caches(model, cache):
    result = run(model, ReMDMScheduler(loop_steps=2), cache=CACHES[cache]())
    assert not (result.tokens == model.mask_token_id).any()
    assert result.nfe.tolist() == [2 * (8 + 2)] * 3


def test_sampling_terminates_and_repeats(model):
    a, b = (run(model, ReMDMScheduler(loop_steps=2), temperature=1.0) for _ in range(2))
    assert torch.equal(a.tokens, b.tokens) and not (a.tokens == model.mask_token_id).any()


@pytest.mark.parametrize("field, value", [("loop_steps", -1), ("loop_number", 0),
                                          ("insert_at", 1.5), ("steps_per_block", -2)])
def test_bad_settings_are_refused_in_one_line(field, value):
    with pytest.raises(ValueError, match=field):
        ReMDMScheduler(**{field: value})


@dataclass(frozen=True)
class _Stuck(Scheduler):
    """A budgeted rule that never commits: the loop must stop it at its budget."""

    revises: ClassVar[str] = "block"

    def step_budget(self, block_length: int) -> int | None:
        return block_length + 2

    def select(self, inp, state: Any):
        return Decision(commit=torch.zeros_like(inp.eligible)), state


def test_a_budgeted_rule_may_stall_but_not_past_its_budget(model):
    with pytest.raises(RuntimeError, match="still has masks"):
        generate(model, [[1, 2]], DecodeConfig(_Stuck(), gen_length=4, block_length=4))


# -- the MDLM form -------------------------------------------------------------------------------

SCHEDULE_SETTINGS = [dict(schedule="loop"), dict(schedule="cap", eta=0.1),
                     dict(schedule="rescale", eta=0.2), dict(schedule="conf")]


@pytest.mark.parametrize("settings", SCHEDULE_SETTINGS)
def test_mdlm_mode_leaves_no_mask_within_its_budget(model, settings):
    scheduler = ReMDMScheduler(mode="mdlm", **settings)
    result = run(model, scheduler, gen=16, block=4)
    assert not (result.tokens == model.mask_token_id).any()
    assert (result.nfe <= 16).all()                      # T = the generation length, one block
    again = run(model, scheduler, gen=16, block=4)
    assert torch.equal(result.tokens, again.tokens)
    for row, prompt in enumerate(PROMPTS):                # rows draw alike alone and batched
        alone = run(model, scheduler, prompts=[prompt], gen=16, block=4)
        assert torch.equal(result.tokens[row], alone.tokens[0])


def _chain(scheduler: ReMDMScheduler, seed: int, width: int = 48) -> list[float]:
    """The masked fraction after each of T = width steps, on a fixed random model, driven by
    the rule's own decisions (commits unmask, re-masks mask)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, width, 6, generator=g)
    masked = torch.ones(1, width, dtype=torch.bool)
    current = torch.full((1, width), 5)
    state, fractions = None, []
    for k in range(width):
        inp = step_input(logits, masked=masked, step=k, num_steps=width, generator=g)
        inp = dataclasses.replace(inp, current=torch.where(masked, 5, current), revisable=~masked,
                                  mask_id=5)
        decision, state = scheduler.select(inp, state)
        commit = decision.commit & inp.eligible
        current = torch.where(commit, inp.candidates, current)
        masked = (masked & ~commit) | (decision.remask & ~masked)
        fractions.append(float(masked.float().mean()))
    return fractions


@pytest.mark.parametrize("settings", SCHEDULE_SETTINGS[:3] + [dict(schedule="cap", eta=0.0)])
def test_mdlm_mode_keeps_the_masked_fraction_on_one_minus_alpha_s(settings):
    """ReMDM's defining property: whatever sigma, the unmasked fraction follows alpha_s (mean
    over 40 chains of 48 columns; 5 points of tolerance, a few standard errors). `conf` puts
    sigma 0 on masked columns (as the reference does), so it is not held to it."""
    scheduler = ReMDMScheduler(mode="mdlm", **settings)
    runs = torch.tensor([_chain(scheduler, seed) for seed in range(40)])
    want = torch.tensor([1 - scheduler.alphas(k, 48)[1] for k in range(48)])
    assert (runs.mean(0) - want).abs().max() < 0.05
    assert runs[:, -1].eq(0).all()                       # the last step commits every mask
    if settings.get("eta") == 0.0:                        # sigma = 0: MDLM, nothing taken back
        assert (runs[:, 1:] <= runs[:, :-1]).all()


def test_mdlm_mode_runs_without_a_cache_only():
    with pytest.raises(ValueError, match="use cache 'none'"):
        DecodeConfig(ReMDMScheduler(mode="mdlm"), cache=CACHES["dual"]())


@pytest.mark.parametrize("field, value", [("mode", "x"), ("schedule", "y"), ("eta", 2.0),
                                          ("t_on", 0.01), ("alpha_on", 1.0), ("steps", -1)])
def test_bad_mdlm_settings_are_refused_in_one_line(field, value):
    with pytest.raises(ValueError, match=field):
        ReMDMScheduler(**{field: value})


def test_mdlm_conf_re_masks_more_than_mdlm_and_still_finishes():
    """Negative control for the marginal test: `conf` takes tokens back without committing
    masks faster, so its masked fraction runs above 1 - alpha_s; the last step still empties."""
    scheduler = ReMDMScheduler(mode="mdlm", schedule="conf")
    runs = torch.tensor([_chain(scheduler, seed) for seed in range(20)])
    want = torch.tensor([1 - scheduler.alphas(k, 48)[1] for k in range(48)])
    assert (runs.mean(0) - want).max() > 0.05 and runs[:, -1].eq(0).all()


def test_mdlm_loop_holds_alpha_on_between_t_off_and_t_on():
    scheduler = ReMDMScheduler(mode="mdlm")
    phases = [scheduler.alphas(k, 100) for k in range(100)]
    held = [p for k, p in enumerate(phases) if 0.05 < 1 - k / 100 <= 0.55]
    assert held and all(p == (0.9, 0.9, 0.02) for p in held)
    assert phases[-1][1] == pytest.approx(1.0) and phases[-1][2] == 0.0
