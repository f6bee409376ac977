"""ReMDM: remasking discrete diffusion as inference-time scaling (Wang et al., NeurIPS 2025,
arXiv 2503.00307), in the count form of its LLaDA port (`guanghanwang/ReMDM-LLaDA`, as carried
by ParallelBench's `remasking/llada/remdm.py`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import masked_scores, tokens_per_step, topk_mask
from dllm_decode.schedulers.columns import carry


@dataclass(frozen=True)
class ReMDMScheduler(Scheduler):
    """Low-confidence steps, then loop steps that re-mask the least confident commits and re-predict.

    Per block of B columns, the ordinary LLaDA schedule commits the most confident masks,
    `steps_per_block` steps (0: B, one token per step; the counts front-loaded as LLaDA's
    `get_num_transfer_tokens`). After ordinary step `k* = min(max(floor(insert_at * S), 1), S - 1)`
    (S the ordinary steps), `loop_steps` loop steps are inserted. Before each loop step's forward
    the `loop_number` committed block tokens with the lowest confidence at their commit are
    re-masked; the loop step then commits the `loop_number` most confident masks. A loop step
    makes no net progress, so a block takes S + `loop_steps` forwards: the rule spends a fixed
    budget of extra forwards on re-predicting the least supported tokens (quality at equal NFE,
    not speed). The last step commits every remaining mask. Every cache runs it: the re-masks
    stay inside the active block, which every step recomputes.

    Mapped onto the one-decision-per-step loop: the re-mask that precedes loop step s + 1 is
    returned by step s, together with step s's commits; a column step s would commit and also
    re-mask is simply not committed (the next forward sees the same canvas as the reference's).
    The rule declares a step budget (S + `loop_steps` per block): the loop does not clamp its
    re-masks to its commits, and does not force progress in its steps.

    Defaults: `loop_steps = 1` and `loop_number = 1` are this project's (the port asserts both are
    given and has no default); `insert_at = 7/8` is the port's. Deviations, each a fix of the
    port: the insertion index is computed from the ordinary steps, not from the block length
    (the port applies a block-length index to the step list, which means "after 7/8 of the
    tokens" only at one token per step); only committed columns of the active block are ever
    re-masked (the port's `topk` over a cache with fewer finite entries than `loop_number` picks
    masked or prompt columns and writes [MASK] over them); batch > 1; greedy or the loop's
    Gumbel sampling (the port samples from softmax(l / T)). A column may be re-masked at most
    `MAX_REVISIONS` times (loop_steps <= 4 never reaches it). Not implemented: ReMDM's MDLM
    form (the stochastic sigma schedules cap / rescale / conf / loop over a whole-canvas block),
    which needs a per-step transition draw for every generated column.
    """

    revises: ClassVar[str] = "block"

    steps_per_block: int = 0
    loop_steps: int = 1
    loop_number: int = 1
    insert_at: float = 0.875

    def __post_init__(self) -> None:
        if self.steps_per_block < 0:
            raise ValueError(f"steps_per_block must be >= 0 (0: one token per step), "
                             f"got {self.steps_per_block}")
        if self.loop_steps < 0:
            raise ValueError(f"loop_steps must be >= 0, got {self.loop_steps}")
        if self.loop_number < 1:
            raise ValueError(f"loop_number must be >= 1, got {self.loop_number}")
        if not 0.0 <= self.insert_at <= 1.0:
            raise ValueError(f"insert_at must be in [0, 1], got {self.insert_at}")

    def step_budget(self, block_length: int) -> int | None:
        return (self.steps_per_block or block_length) + self.loop_steps

    def plan(self, block_length: int) -> tuple[int, int]:
        """(S ordinary steps, k*: the ordinary step after which the loop steps come)."""
        ordinary = self.steps_per_block or block_length
        return ordinary, min(max(math.floor(self.insert_at * ordinary), 1), ordinary - 1)

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        ordinary, insert = self.plan(inp.num_steps)
        k = inp.step
        in_loop = insert < k <= insert + self.loop_steps
        last = k >= ordinary - 1 + self.loop_steps
        before_loop = self.loop_steps > 0 and insert <= k < insert + self.loop_steps
        eligible = inp.eligible.sum(-1)
        if in_loop:
            count = torch.clamp(eligible, max=self.loop_number)
        else:
            done = k if k <= insert else k - self.loop_steps       # ordinary steps taken
            count = tokens_per_step(eligible, torch.full_like(eligible, max(ordinary - done, 1)))
        if last:
            count = eligible
        commit = topk_mask(inp.confidence, count)
        at_commit = self._at_commit(inp, state)
        at_commit = torch.where(commit, inp.confidence, at_commit)
        remask = torch.zeros_like(commit)
        if before_loop and not last:
            pool = inp.revisable | commit if inp.revisable is not None else commit
            picked = topk_mask(masked_scores(-at_commit, pool),
                               torch.full_like(eligible, self.loop_number))
            remask, commit = picked & ~commit, commit & ~picked
        at_commit = at_commit.masked_fill(remask | ~(commit | ~inp.is_masked), float("inf"))
        return Decision(commit=commit, remask=remask), (at_commit, inp.columns.expand_as(at_commit)[:, 0])

    def _at_commit(self, inp: StepInput, state: Any) -> Tensor:
        """(B, W) confidence at commit of the window's committed columns (+inf where unknown),
        reset at each block's first step."""
        inf = torch.full_like(inp.confidence, float("inf"))
        if state is None or inp.step == 0:
            return inf
        values, start = state
        return carry(values, start, inp.columns.expand_as(inp.confidence), float("inf"))
