"""Fast-dLLM's factor rule (Wu et al., 2025, arXiv 2505.22618, Theorem 1; code
`get_transfer_index_dynamic`, NVlabs/Fast-dLLM@f6b35ec)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dllm_decode.interfaces import Decision, Scheduler, StepInput


@dataclass(frozen=True)
class FactorScheduler(Scheduler):
    """Commit the longest confidence-sorted prefix with (n + 1)(1 - c_(n)) <= f for every n.

    Sort a row's eligible confidences c_(1) >= c_(2) >= ...; c_(1) is always accepted; the
    prefix stops at the first n >= 2 with c_(n) < 1 - f/(n+1) (boundary values pass, as the
    code's `<` rejection). Vectorised with a cumulative product. Fixes two reference bugs: the
    off-by-one that commits all N when only the last candidate fails, and the IndexError on
    rows with no masks (spec schedulers.md §1d). Default f = 1.0 (eval_gsm8k.sh).
    """

    factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.factor > 0.0:
            raise ValueError(f"factor must be > 0, got {self.factor}")

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        ranked, order = inp.confidence.sort(dim=-1, descending=True, stable=True)
        n = torch.arange(1, ranked.shape[-1] + 1, device=ranked.device, dtype=ranked.dtype)
        passes = ranked >= 1 - self.factor / (n + 1)
        passes[..., 0] = True                            # c_(1) always accepted
        keep_sorted = passes.long().cumprod(-1).bool() & (ranked > float("-inf"))
        commit = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        return Decision(commit=commit), state
