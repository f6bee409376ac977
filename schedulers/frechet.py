"""Fast-dLLM++: Fréchet-profile decoding (arXiv 2606.02955; code `Ringo-Star/FastdLLM_plusplus`
`v1/llada/generate.py`, `get_transfer_index_frechet_profile`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.schedulers.prefix import sorted_prefix


@dataclass(frozen=True)
class FrechetScheduler(Scheduler):
    """Commit the top-n confidences while the Fréchet lower bound beats the runner-up bound by `margin`.

    Sort a row's eligible confidences c_(1) >= c_(2) >= ...; with
    L_n = sum_{j<=n} c_(j) - (n - 1) (the Fréchet-Hoeffding lower bound on all n being right) and
    U_n = 1 - c_(n), commit the longest prefix with G_n = L_n - U_n > margin (strict, as the code);
    rank 1 always passes. G is non-increasing in n, so this is the count of passing n. With equal
    confidences it is Fast-dLLM's factor rule at f = 1 - margin with a strict bar (the `factor`
    rule accepts the boundary); otherwise it commits at least as many (the heterogeneity bonus
    sum_{j<n} (c_(j) - c_(n)) >= 0). margin >= 1 commits one token per step.

    Default margin 0.25 ("the global default used in the main tables", README; per task it
    recommends 0.25-0.30 GSM8K, 0.20-0.25 HumanEval, 0.02-0.20 MBPP, 0.02-0.30 MATH).
    Deviations: ties are ordered lowest column first (stable sort; the reference's `torch.sort`
    is unstable); the README's `max(0, L_n)` clamp is not applied, as in the code (for
    margin >= 0 both give the same n).
    """

    canvas_kinds: ClassVar[tuple[str, ...]] = ("mask", "noise")   # its rule reads only the step's view

    margin: float = 0.25

    def __post_init__(self) -> None:
        if math.isnan(self.margin) or self.margin < 0.0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        return Decision(commit=sorted_prefix(inp.confidence, self._passes)), state

    def _passes(self, ranked: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        finite = torch.where(ranked > float("-inf"), ranked.double(), 0.0)
        n = torch.arange(1, ranked.shape[-1] + 1, device=ranked.device, dtype=torch.float64)
        return finite.cumsum(-1) + finite - n > self.margin
