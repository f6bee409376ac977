"""The loop's contract for schedulers that take tokens back (`Scheduler.revises`, `Decision.remask`
and `Decision.edit`): scope, the net-progress budget, the per-column cap, post-fill edit passes,
the trace, termination on random logits, batched == one by one, and no effect on the rest."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_decode import DecodeConfig, generate
from dllm_decode.caches import DualCache
from dllm_decode.interfaces import Decision, StepInput
from dllm_decode.sampler import MAX_REVISIONS
from dllm_decode.schedulers import SCHEDULERS, LowConfidenceScheduler, ThresholdScheduler
from dllm_decode.testing import OracleMaskPredictor, tiny_llada

VOCAB, MASK, EOS = 37, 36, 35


@dataclass(frozen=True)
class NeverRevises(ThresholdScheduler):
    """The threshold rule under a revising scope that never uses it."""

    revises: ClassVar[str] = "block"


@dataclass(frozen=True)
class RemaskAll(LowConfidenceScheduler):
    """Commits like LLaDA (two per step here) and asks to take back every revisable column every
    step (the loop must bound it)."""

    revises: ClassVar[str] = "block"

    def select(self, inp: StepInput, state):
        decision, state = super().select(inp, state)
        return dataclasses.replace(decision, remask=torch.ones_like(inp.eligible)), state


@dataclass(frozen=True)
class RandomReviser(ThresholdScheduler):
    """Random commits, re-masks and edits anywhere (the loop must keep only what is allowed)."""

    revises: ClassVar[str] = "block"
    post_steps: int = 3

    def select(self, inp: StepInput, state):
        g = inp.generator
        draw = lambda: torch.rand(inp.eligible.shape, generator=g) < 0.5  # noqa: E731
        tokens = torch.randint(0, VOCAB - 2, inp.eligible.shape, generator=g)
        return Decision(commit=draw(), tokens=tokens, remask=draw(), edit=draw()), state


@dataclass(frozen=True)
class AlwaysEdits(ThresholdScheduler):
    """Edits every committed block column to a new token every pass."""

    revises: ClassVar[str] = "block"
    post_steps: int = 2

    def select(self, inp: StepInput, state):
        decision, state = super().select(inp, state)
        tokens = torch.where(inp.revisable, (inp.current + 1) % (VOCAB - 2), inp.candidates)
        return dataclasses.replace(decision, tokens=tokens, edit=inp.revisable), state


def config(scheduler, gen=8, block=4, **kw):
    return DecodeConfig(scheduler=scheduler, gen_length=gen, block_length=block, **kw)


REVISING = {"edit": "block", "remdm": "block", "saber": "generated", "wino": "block"}  # registered rules that take tokens back


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_schedulers_declare_whether_they_revise(name):
    assert SCHEDULERS[name]().revises == REVISING.get(name, "none")


def test_an_unused_revision_scope_changes_nothing():
    model, prompts = tiny_llada(seed=3), [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    plain = generate(model, prompts, config(ThresholdScheduler(), gen=16, block=8))
    scoped = generate(model, prompts, config(NeverRevises(), gen=16, block=8))
    assert torch.equal(plain.tokens, scoped.tokens) and torch.equal(plain.nfe, scoped.nfe)


def test_remasks_are_bounded_by_commits_minus_one_and_inside_the_block():
    model = OracleMaskPredictor(torch.tensor([3, 4, 5, 6, 7, 8, 9, 10]), torch.tensor([0.95] * 8),
                                VOCAB, MASK, EOS)
    result = generate(model, [[1, 2]], config(RemaskAll(steps_per_block=2), gen=8, block=4),
                      trace=True)
    assert not (result.tokens == MASK).any() and result.tokens[0].tolist() == list(range(3, 11))
    for step in result.trace:
        commits, remasks = int(step["commit"].sum()), int(step["remask"].sum())
        assert remasks <= max(commits - 1, 0)
        block_start = 4 * (step["offset"] // 4)                 # the window starts at the block
        assert not step["remask"][0, block_start - step["offset"] + 4:].any()
    assert sum(int(step["remask"].sum()) for step in result.trace) > 0, "the bound allows some"


def test_editing_runs_post_fill_passes_up_to_the_budget():
    model = OracleMaskPredictor(torch.tensor([3, 4, 5, 6]), torch.tensor([0.99] * 4), VOCAB, MASK, EOS)
    result = generate(model, [[1, 2]], config(AlwaysEdits(), gen=4, block=4, stop_at_eos=False),
                      trace=True)
    # step 1 fills the block; then 2 post passes (the budget), each editing every column
    assert result.nfe.tolist() == [3] and len(result.trace) == 3
    assert [int(s["edit"].sum()) for s in result.trace] == [0, 4, 4]
    assert result.tokens[0].tolist() == [5, 6, 7, 8]


def test_a_column_is_revised_at_most_max_revisions_times():
    model = OracleMaskPredictor(torch.tensor([3, 4, 5, 6]), torch.tensor([0.99] * 4), VOCAB, MASK, EOS)
    budget = AlwaysEdits(post_steps=MAX_REVISIONS + 5)
    result = generate(model, [[1, 2]], config(budget, gen=4, block=4, stop_at_eos=False), trace=True)
    per_column = sum(s["edit"][0].int() for s in result.trace)
    assert per_column.max() == MAX_REVISIONS


def test_backtracking_into_earlier_blocks_needs_the_no_cache_loop():
    @dataclass(frozen=True)
    class Backtracks(ThresholdScheduler):
        revises: ClassVar[str] = "generated"

    with pytest.raises(ValueError, match="use cache 'none'"):
        DecodeConfig(scheduler=Backtracks(), cache=DualCache(), gen_length=8, block_length=4)
    result = generate(tiny_llada(), [[1, 2]], config(Backtracks()))
    assert not (result.tokens == MASK).any()


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), gen=st.sampled_from([4, 8, 12]), block=st.sampled_from([2, 4]),
       batch=st.integers(1, 3))
def test_random_revisions_always_terminate_with_no_mask(seed, gen, block, batch):
    model = tiny_llada(seed=seed % 7, layers=1)
    prompts = [[1 + (seed + i) % 20, 2, 3][: 1 + i] for i in range(batch)]
    result = generate(model, prompts, config(RandomReviser(), gen=gen, block=block),
                      generator=torch.Generator().manual_seed(seed), trace=True)
    assert not (result.tokens == MASK).any()
    assert int(result.nfe.max()) <= gen // block * (block + 3 + 1)
    for step in result.trace:
        assert ((step["commit"] & step["remask"]) == 0).all()
        assert (step["remask"].sum(-1) <= (step["commit"].sum(-1) - 1).clamp_min(0)).all()


def test_revising_batched_equals_one_by_one():
    @dataclass(frozen=True)
    class RemaskLowest(ThresholdScheduler):
        """Deterministic: take back the least confident revisable column of each row."""

        revises: ClassVar[str] = "block"

        def select(self, inp: StepInput, state):
            decision, state = super().select(inp, state)
            support = inp.probs.gather(-1, inp.current.unsqueeze(-1)).squeeze(-1)
            worst = torch.where(inp.revisable, support, torch.inf)
            pick = (worst == worst.amin(-1, keepdim=True)) & inp.revisable
            return dataclasses.replace(decision, remask=pick), state

    model, prompts = tiny_llada(seed=4), [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    cfg = config(RemaskLowest(threshold=0.3), gen=16, block=8)
    batched = generate(model, prompts, cfg)
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], cfg)
        assert torch.equal(batched.tokens[row], alone.tokens[0])
        assert batched.nfe[row] == alone.nfe[0]
