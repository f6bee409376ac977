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
