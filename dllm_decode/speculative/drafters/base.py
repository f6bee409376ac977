"""What a drafter proposes each round (`Draft`) and the interface every drafter implements."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.fields import Checked
from dllm_decode.speculative.sampling import Sampling
from dllm_decode.speculative.tree import depths, is_chain, spine as spine_of


@dataclass(frozen=True)
class Draft:
    """Proposed continuation tokens, a chain or a tree, and what verification needs to know.

    A chain of g tokens is the width-1 tree; a tree lists its n nodes breadth-first with their
    parents (`dllm_decode.speculative.tree`), siblings in the order they were proposed.

    Attributes:
        tokens: (n,) long proposed tokens, n >= 0.
        confidence: (n,) float32 the drafter's probability of each token (1 for a drafter
            without probabilities): what the draft-length scheduler reads (on the spine).
        probs: (n, V) float32 the law each token was drawn from (after the target's
            temperature/top-k/top-p; for a later sibling, given the earlier ones; one-hot for a
            deterministic node), or None when every node is deterministic, in which case
            verification uses one-hot laws (a deterministic proposal is a point mass, so
            speculative sampling accepts it with probability p(token)).
        view: (n, V) float32 distributions shown to the scheduler (`StepInput.probs`), or None
            for one-hot rows at the tokens.
        forwards: drafter forward passes spent on this draft (its NFE).
        parents: each node's parent (-1: a child of the root, the last context token), or None
            for a chain.
    """

    tokens: Tensor
    confidence: Tensor
    probs: Tensor | None = None
    view: Tensor | None = None
    forwards: int = 0
    parents: tuple[int, ...] | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def depth(self) -> int:
        """Levels of the tree (a chain's length)."""
        return len(self) if self.parents is None else 1 + max(depths(self.parents), default=-1)

    def nodes(self, index: Sequence[int], parents: tuple[int, ...] | None) -> Draft:
        """The draft restricted to the nodes `index` (laid out with `parents`)."""
        rows = torch.tensor(list(index), dtype=torch.long, device=self.tokens.device)
        pick = (lambda t: None if t is None else t[rows])
        return Draft(self.tokens[rows], self.confidence[rows], pick(self.probs), pick(self.view),
                     self.forwards, parents)

    def head(self, g: int) -> Draft:
        """The first `g` levels (what the scheduler let through): a chain's first g tokens."""
        if self.parents is not None:
            keep = sum(1 for d in depths(self.parents) if d < g)     # breadth-first: a prefix
            parents = self.parents[:keep]
            return self.nodes(range(keep), None if is_chain(parents) else parents)
        cut = (lambda t: None if t is None else t[:g])
        return Draft(self.tokens[:g], self.confidence[:g], cut(self.probs), cut(self.view),
                     self.forwards)

    def spine(self) -> Draft:
        """The chain of first children (the whole draft when it is a chain)."""
        return self if self.parents is None else self.nodes(spine_of(self.parents), None)

    @staticmethod
    def empty(device: torch.device | str = "cpu", forwards: int = 0) -> Draft:
        return Draft(torch.zeros(0, dtype=torch.long, device=device),
                     torch.zeros(0, device=device), forwards=forwards)


class Drafter(Checked, abc.ABC):
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
        """Draft at most `width` (>= 1) levels after `context` ((n,) long): a chain of at most
        `width` tokens, or a tree of at most `width` levels.

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
