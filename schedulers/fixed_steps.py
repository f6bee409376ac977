"""Fixed-step baselines: commit a scheduled number of the best-scored masked positions per step.

`low_confidence` and `random` are LLaDA's remasking strategies (Nie et al., 2025, arXiv
2502.09992, Alg. 5 / `generate.py`); `margin`, `entropy` and `maskgit_plus` are Dream's `alg`
options (Ye et al., 2025, arXiv 2508.15487; `generation_utils.py`). They differ only in the
score that ranks positions and, between the two papers, in the count schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import aligned_uniform, masked_scores, neg_entropy, tokens_per_step, top2, topk_mask


@dataclass(frozen=True)
class _FixedSteps(Scheduler):
    """Shared rule: score, then commit the per-row top `count(step)` eligible positions.

    `steps_per_block` is LLaDA's `steps / num_blocks` (None: the block length, one token per
    step). The count is recomputed from the masks left, which equals LLaDA's front-loaded plan
    `floor(M/K) + (k < M mod K)` whenever the plan was followed.
    """

    canvas_kinds: ClassVar[tuple[str, ...]] = ("mask", "noise")   # its rule reads only the step's view

    steps_per_block: int | None = bounded(None, most=MAX_CANVAS, scales="memory")

    def __post_init__(self) -> None:
        if self.steps_per_block is not None and self.steps_per_block < 1:
            raise ValueError(f"steps_per_block must be >= 1 or None (one token per step), "
                             f"got {self.steps_per_block}")

    def score(self, inp: StepInput) -> Tensor:
        raise NotImplementedError

    def count(self, inp: StepInput) -> Tensor:
        steps = self.steps_per_block or inp.num_steps
        left = torch.zeros_like(inp.live, dtype=torch.long) + (steps - inp.step)  # step: int or 0-d
        return tokens_per_step(inp.eligible.sum(-1), left)

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        scores = masked_scores(self.score(inp), inp.eligible)
        return Decision(commit=topk_mask(scores, self.count(inp))), state


@dataclass(frozen=True)
class LowConfidenceScheduler(_FixedSteps):
    """LLaDA low-confidence remasking: keep the most confident predictions, a fixed number per step.

    Ties go to the leftmost position (stable sort). EOS is treated like any token; the loop's
    `stop_at_eos` policy ends a row after a block that contains it (not LLaDA's
    `confidence_eos_eot_inf`, a chained assignment that suppresses EoT's confidence but not EOS's
    when sampling, both when greedy).
    """

    capturable = True

    def score(self, inp: StepInput) -> Tensor:
        return inp.confidence


@dataclass(frozen=True)
class RandomScheduler(_FixedSteps):
    """LLaDA `remasking='random'`: the same count schedule, positions ranked by U(0, 1) draws."""

    def score(self, inp: StepInput) -> Tensor:
        # drawn for the block's columns only, so a row's draws do not depend on the window
        draws = aligned_uniform(inp.block[:, 0], inp.num_steps, inp.offset, inp.confidence.shape[1],
                                inp.generator)
        return draws.nan_to_num(0.0)


@dataclass(frozen=True)
class _DreamSteps(_FixedSteps):
    """Dream's schedule: with t = 1 - k(1-eps)/K and s the next time, commit floor(M (1 - s/t))
    (everything at the last step); the loop adds one position when the floor is 0."""

    eps: float = 1e-3

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.eps < 1.0:
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")

    def count(self, inp: StepInput) -> Tensor:
        steps = self.steps_per_block or inp.num_steps
        masked = inp.eligible.sum(-1)
        if inp.step >= steps - 1:
            return masked
        t = 1 - inp.step * (1 - self.eps) / steps
        s = 1 - (inp.step + 1) * (1 - self.eps) / steps
        return torch.floor(masked * (1 - s / t) + 1e-9).long() if not math.isclose(t, 0) else masked


@dataclass(frozen=True)
class MarginScheduler(_DreamSteps):
    """Dream `topk_margin`: rank by the top-1 minus top-2 probability."""

    def score(self, inp: StepInput) -> Tensor:
        first, second = top2(inp.probs)
        return first - second


@dataclass(frozen=True)
class EntropyScheduler(_DreamSteps):
    """Dream `entropy`: rank by negative entropy sum p log p (most certain first)."""

    def score(self, inp: StepInput) -> Tensor:
        return neg_entropy(inp.probs)
