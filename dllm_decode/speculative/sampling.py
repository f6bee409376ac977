"""How a next-token distribution is drawn from logits: temperature, top-k, top-p.

The same `Sampling` warps the target's and the draft's logits: speculative sampling is exact only
when `q` is the distribution the draft token was actually drawn from and `p` went through the
identical warping (HF #32867, #47932: a raw-logit q under a warped p is not lossless).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.fields import check_types


@dataclass(frozen=True)
class Sampling:
    """Next-token sampling of both models. `temperature = 0` is greedy (argmax, first index on ties).

    Attributes:
        temperature: 0 (greedy) or a positive softmax temperature, at most 100.
        top_k: keep the k largest logits (None: all). Ties at the k-th value are all kept, as
            HF's `TopKLogitsWarper` (it compares against the k-th value).
        top_p: nucleus: keep the smallest set of most likely tokens whose mass reaches top_p
            (HF's `TopPLogitsWarper`: ascending sort, drop the prefix with cumulative mass
            <= 1 - top_p, always keep the most likely token). None: all.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: Tensor) -> Tensor:
        """(…, V) logits -> (…, V) float32 warped distribution (exact zeros outside top-k/top-p).

        Greedy sampling has no distribution to warp; the plain softmax is returned (what the
        confidence of a greedy pick is read from).
        """
        logits = logits.float()
        if self.greedy:
            return logits.softmax(-1)
        logits = logits / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            ascending, order = logits.sort(dim=-1)
            cumulative = ascending.softmax(-1).cumsum(-1)
            drop = cumulative <= 1 - self.top_p
            drop[..., -1] = False                        # the most likely token always stays
            logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        return logits.softmax(-1)

    def draw(self, logits: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """One token per row of (N, V) logits and the (N, V) distribution it came from.

        Greedy: argmax, with the plain softmax as the reported distribution (its draft law is
        one-hot; callers that verify treat a greedy draft as deterministic).
        """
        probs = self.probs(logits)
        if self.greedy:
            return logits.argmax(-1), probs
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1), probs
