"""EB-sampler: entropy-bounded unmasking (Ben-Hamu et al., 2025, arXiv 2505.24857, §3)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import neg_entropy
from dllm_decode.schedulers.prefix import sorted_prefix


@dataclass(frozen=True)
class EntropyBoundScheduler(Scheduler):
    """Commit the longest confidence-sorted prefix whose entropy sum, less its largest term, is <= gamma.

    Sort eligible positions by confidence (the error proxy), descending, ties to the lower
    column; with H_j their entropies in that order, commit the largest n with
    sum_{j<=n} H_j - max_{j<=n} H_j <= gamma. The first position always passes (its bound is 0),
    so at least one token commits. gamma = 0 commits one token per step unless several are
    exactly certain; gamma = inf commits the whole block. The running max is taken along the
    sequence axis (a public port takes it over the batch axis, a bug). Default gamma = 0.001
    (the port's default; the paper sweeps gamma). No official code was found.
    """

    canvas_kinds: ClassVar[tuple[str, ...]] = ("mask", "noise")   # its rule reads only the step's view

    gamma: float = 0.001
    infinite_ok = ("gamma",)          # documented: inf is a valid setting

    def __post_init__(self) -> None:
        if math.isnan(self.gamma) or self.gamma < 0.0:
            raise ValueError(f"gamma must be in [0, inf], got {self.gamma}")

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        entropy = -neg_entropy(inp.probs)

        def passes(ranked: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
            sorted_entropy = torch.where(ranked > float("-inf"), entropy.gather(-1, order), 0.0)
            bound = sorted_entropy.cumsum(-1) - sorted_entropy.cummax(-1).values
            return bound <= self.gamma

        return Decision(commit=sorted_prefix(inp.confidence, passes)), state
