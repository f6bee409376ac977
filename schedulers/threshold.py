"""Fast-dLLM's confidence-threshold rule (Wu et al., 2025, arXiv 2505.22618, §3.3, Alg. 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from dllm_decode.interfaces import Decision, Scheduler, StepInput


@dataclass(frozen=True)
class ThresholdScheduler(Scheduler):
    """Commit every eligible position whose confidence is at least `threshold`.

    S = {argmax_i c_i} U {i : c_i >= tau}: the loop adds the most confident position when none
    clears the bar (the Nov 2025 upstream fix, NVlabs/Fast-dLLM PR #45).

    Ties commit (`>=`), faithful to the paper this rule is from: Fast-dLLM v1's released LLaDA
    code (`get_transfer_index`) takes the top-k and drops a position only when its confidence is
    `< threshold`. Fast-dLLM v2's, SDAR's and LLaDA2's generate functions (and SGLang) commit only
    above the bar (`>`). The two differ only on an exact tie, which in practice means tau = 1.0:
    there `>` commits nothing but the forced top-1, `>=` also every saturated probability.
    Positions predicted as [MASK] are never candidates (dInfer's `rm_mask`). Default tau = 0.9
    (paper §4.1).
    """

    canvas_kinds: ClassVar[tuple[str, ...]] = ("mask", "noise")   # its rule reads only the step's view

    capturable = True

    threshold: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        return Decision(commit=inp.confidence >= self.threshold), state
