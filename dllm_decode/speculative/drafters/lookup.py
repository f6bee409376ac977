"""Prompt lookup decoding: copy the continuation of an earlier occurrence of the last n-gram.

Saxena 2023 (apoorvumang/prompt-lookup-decoding); HF `PromptLookupCandidateGenerator`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.speculative.drafters.base import Draft, Drafter, cut_at_eos
from dllm_decode.speculative.sampling import Sampling


@dataclass(frozen=True)
class LookupDrafter(Drafter):
    """Match the context's last n tokens (n = max_ngram down to min_ngram) earlier in the context
    and propose what followed the first (leftmost) match, as HF does.

    Searches the whole context (prompt and generated tokens), like HF, not only the prompt.
    Deterministic: q is one-hot; the confidence of every proposed token is 1. No match drafts
    nothing, and the round is a plain AR step. No model forwards.

    Attributes:
        max_ngram: longest n-gram matched (HF `max_matching_ngram_size`, default 2).
        min_ngram: shortest n-gram tried.
    """

    max_ngram: int = 2
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if self.min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {self.min_ngram}")
        if self.max_ngram < self.min_ngram:
            raise ValueError(f"max_ngram must be >= min_ngram ({self.min_ngram}), got {self.max_ngram}")

    def propose(self, context: Tensor, width: int, sampling: Sampling,
                generator: torch.Generator | None, eos_ids: tuple[int, ...], state: Any,
                stop: Callable[[Draft], bool] | None = None) -> tuple[Draft, Any]:
        length = context.shape[0]
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            windows = context[:length - 1].unfold(0, n, 1)      # (length - n, n), excludes the tail
            hits = (windows == context[length - n:]).all(-1).nonzero()
            if hits.numel():
                start = int(hits[0, 0]) + n                       # < length: never empty
                tokens = context[start:start + width]
                tokens = tokens[:cut_at_eos(tokens, eos_ids)]
                return Draft(tokens, torch.ones(tokens.shape[0], device=context.device)), state
        return Draft.empty(context.device), state
