"""The confidence-sorted prefix rule shared by Fast-dLLM's factor rule and the EB-sampler."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def sorted_prefix(confidence: Tensor, passes: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """Commit the longest prefix of each row's positions, sorted by confidence, that passes.

    Args:
        confidence: (B, W) float, -inf where not eligible.
        passes: (ranked confidences (B, W), sort order (B, W)) -> (B, W) bool, whether rank n
            passes the rule; rank 0 is always accepted (at-least-one).
    Returns:
        (B, W) bool in window order. Ties rank the lower column first (stable sort); rows with no
        eligible position commit nothing (no IndexError, unlike the factor reference code).
    """
    ranked, order = confidence.sort(dim=-1, descending=True, stable=True)
    ok = passes(ranked, order).clone()
    ok[..., 0] = True
    keep = ok.long().cumprod(-1).bool() & (ranked > float("-inf"))
    return torch.zeros_like(keep).scatter(-1, order, keep)
