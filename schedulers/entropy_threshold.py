"""dParallel's entropy-threshold rule (Chen et al., 2025, arXiv 2509.26488, §3.3;
`czg1225/dParallel@2ca4d14: LLaDA/generate.py`, `get_transfer_index_entropy`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import argmax_mask, masked_scores, neg_entropy


@dataclass(frozen=True)
class EntropyThresholdScheduler(Scheduler):
    """Commit every eligible position whose predictive entropy is at most `threshold` nats, plus
    the eligible position of lowest entropy.

    S = {argmin_i H_i} U {i : H_i <= tau}, H_i = -sum_v p_iv log p_iv of the clean softmax (the
    sampling temperature changes the candidate, not the entropy). Ties pass (the reference
    drops a position only when `entropy > threshold`). This is the rule dParallel decodes its
    certainty-forced models with; its `threshold=0.5` is this entropy bar, not Fast-dLLM's
    confidence threshold. tau = 0 commits one token per step
    unless several are exactly certain; tau = inf commits the whole block. Default tau = 0.5
    (dParallel's GSM8K, MATH and HumanEval setting; 0.45 for MBPP).

    Deviations from the reference code: the entropy is computed in float32 from the loop's
    probabilities, with 0 log 0 = 0, where the reference uses float64 and log(p + 1e-12) (the
    two differ by < 1e-6 nats near the bar); [MASK] is never a candidate (the loop's rule), so
    its probability mass does not enter the entropy; among positions of equal lowest entropy
    the lowest column is the forced one (the reference's `topk` leaves that order unspecified).
    """

    canvas_kinds: ClassVar[tuple[str, ...]] = ("mask", "noise")   # its rule reads only the step's view

    threshold: float = 0.5
    infinite_ok = ("threshold",)          # documented: inf is a valid setting

    def __post_init__(self) -> None:
        if math.isnan(self.threshold) or self.threshold < 0.0:
            raise ValueError(f"threshold must be in [0, inf] nats, got {self.threshold}")

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        entropy = -neg_entropy(inp.probs)
        certain = inp.eligible & (entropy <= self.threshold)
        # the at-least-one pick is the lowest-entropy position, not the loop's most confident one
        lowest = argmax_mask(masked_scores(-entropy, inp.eligible))
        return Decision(commit=certain | lowest), state
