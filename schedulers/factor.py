"""Fast-dLLM's factor rule (Wu et al., 2025, arXiv 2505.22618, Theorem 1; code
`get_transfer_index_dynamic`, NVlabs/Fast-dLLM@f6b35ec)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.schedulers.prefix import sorted_prefix


@dataclass(frozen=True)
class FactorScheduler(Scheduler):
    """Commit the longest confidence-sorted prefix with (n + 1)(1 - c_(n)) <= f for every n.

    Sort a row's eligible confidences c_(1) >= c_(2) >= ...; c_(1) is always accepted; the
    prefix stops at the first n >= 2 with c_(n) < 1 - f/(n+1) (boundary values pass, as the
    code's `<` rejection). Vectorised with a cumulative product. Fixes two reference bugs: the
    off-by-one that commits all N when only the last candidate fails, and the IndexError on
    rows with no masks. Default f = 1.0 (eval_gsm8k.sh).
    """

    canvas_kinds: ClassVar[tuple[str, ...]] = ("mask", "noise")   # its rule reads only the step's view

    capturable = True

    factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.factor > 0.0:
            raise ValueError(f"factor must be > 0, got {self.factor}")

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        return Decision(commit=sorted_prefix(inp.confidence, self._passes)), state

    def _passes(self, ranked: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        n = torch.arange(1, ranked.shape[-1] + 1, device=ranked.device, dtype=ranked.dtype)
        return ranked >= 1 - self.factor / (n + 1)
