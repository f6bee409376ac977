"""What a drafter proposes each round (`Draft`) and the interface every drafter implements."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.speculative.sampling import Sampling


@dataclass(frozen=True)
class Draft:
    """Up to `width` proposed continuation tokens and what verification needs to know about them.

    Attributes:
        tokens: (g,) long proposed tokens, g >= 0.
        confidence: (g,) float32 the drafter's probability of each token (1 for a drafter
            without probabilities): what the draft-length scheduler reads.
        probs: (g, V) float32 the distribution each token was drawn from (after the target's
            temperature/top-k/top-p), or None when the drafter is deterministic, in which case
            verification uses a one-hot q (spec speculative.md §1.3).
        view: (g, V) float32 distributions shown to the scheduler (`StepInput.probs`), or None
            for one-hot rows at the tokens.
        forwards: drafter forward passes spent on this draft (its NFE).
    """

    tokens: Tensor
    confidence: Tensor
    probs: Tensor | None = None
    view: Tensor | None = None
    forwards: int = 0

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def head(self, g: int) -> Draft:
        """The first `g` drafted positions (what the scheduler let through)."""
        cut = (lambda t: None if t is None else t[:g])
        return Draft(self.tokens[:g], self.confidence[:g], cut(self.probs), cut(self.view),
                     self.forwards)

    @staticmethod
    def empty(device: torch.device | str = "cpu", forwards: int = 0) -> Draft:
        return Draft(torch.zeros(0, dtype=torch.long, device=device),
                     torch.zeros(0, device=device), forwards=forwards)


class Drafter(abc.ABC):
    """Proposes tokens that continue a context; the target verifies them in one forward.

    Per-request memory (a KV cache, ...) is the explicit `state` from `init_state`, never an
    attribute, so one drafter serves many requests.
    """

    def init_state(self) -> Any:
        """A new request starts."""
        return None

    @abc.abstractmethod
    def propose(self, context: Tensor, width: int, sampling: Sampling,
                generator: torch.Generator | None, eos_ids: tuple[int, ...], state: Any,
                stop: Callable[[Draft], bool] | None = None) -> tuple[Draft, Any]:
        """Draft at most `width` (>= 1) tokens after `context` ((n,) long).

        Tokens after a drafted end-of-text are dropped (HF's prompt-lookup comment: otherwise
        "the target model may accept eos and the rest as valid"). A drafter that drafts one
        token at a time may call `stop(draft_so_far)` after each token and stop early when it
        returns True (the scheduler already cut before the newest token).
        """


def cut_at_eos(tokens: Tensor, eos_ids: tuple[int, ...]) -> int:
    """Number of leading tokens to keep: through the first end-of-text token, or all."""
    if not eos_ids or not tokens.numel():
        return int(tokens.shape[0])
    is_eos = torch.isin(tokens, torch.tensor(eos_ids, device=tokens.device))
    return int(torch.where(is_eos.any(), is_eos.int().argmax() + 1, tokens.shape[0]))
