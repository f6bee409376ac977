"""Prompt lookup decoding: copy the continuation of an earlier occurrence of the last n-gram.

Saxena 2023 (apoorvumang/prompt-lookup-decoding); HF `PromptLookupCandidateGenerator`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.fields import bounded
from dllm_decode.speculative.drafters.base import Draft, Drafter, cut_at_eos
from dllm_decode.speculative.drafters.spec import Built, DraftContext, DraftSpec
from dllm_decode.speculative.sampling import Sampling
from dllm_decode.speculative.tree import TreeBuilder, TreeShape


@dataclass(frozen=True)
class LookupDrafter(Drafter):
    """Match the context's last n tokens (n = max_ngram down to min_ngram) earlier in the context
    and propose what followed the first (leftmost) match, as HF does.

    Searches the whole context (prompt and generated tokens), like HF, not only the prompt.
    Deterministic: q is one-hot; the confidence of every proposed token is 1. No match drafts
    nothing, and the round is a plain AR step. No model forwards.

    Tree (`tree` with branch > 1): every match of the longest matching n-gram proposes its
    continuation, merged into a trie (the n-gram analogue of staged SD's trigram drafter and of
    REST's retrieved continuations): the spine is the leftmost match's continuation (the chain),
    each node keeps its `branch` most frequent next tokens, and the budget keeps the most frequent
    paths (`TreeBuilder.select`, value = log relative frequency).

    Attributes:
        max_ngram: longest n-gram matched (HF `max_matching_ngram_size`, default 2).
        min_ngram: shortest n-gram tried.
        tree: the tree's shape; None (or branch 1) proposes a chain.
    """

    max_ngram: int = bounded(2, most=64, scales="work")
    min_ngram: int = bounded(1, most=64, scales="work")
    tree: TreeShape | None = None

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
            if not hits.numel():
                continue
            if self.tree is None or self.tree.is_chain:
                start = int(hits[0, 0]) + n                       # < length: never empty
                tokens = context[start:start + width]
                tokens = tokens[:cut_at_eos(tokens, eos_ids)]
                return Draft(tokens, torch.ones(tokens.shape[0], device=context.device)), state
            return self._trie(context, hits[:, 0] + n, width, eos_ids), state
        return Draft.empty(context.device), state

    def _trie(self, context: Tensor, starts: Tensor, width: int, eos_ids: tuple[int, ...]) -> Draft:
        """The continuations after every match, merged into a budgeted trie."""
        ids = context.tolist()
        continuations = []
        for start in starts.tolist():
            tokens = ids[start:start + width]
            cut = next((i + 1 for i, t in enumerate(tokens) if t in eos_ids), len(tokens))
            continuations.append(tuple(tokens[:cut]))
        kids: dict[tuple[int, ...], dict[int, int]] = {}       # prefix -> next token -> count
        for tokens in continuations:
            for i, token in enumerate(tokens):
                following = kids.setdefault(tokens[:i], {})
                following[token] = following.get(token, 0) + 1
        spine = continuations[0]
        tree = TreeBuilder()
        level: list[tuple[int, tuple[int, ...], int]] = [(-1, (), len(continuations))]
        while level:                                    # (node, its prefix, its count)
            deeper = []
            for node, prefix, total in level:
                counts = kids.get(prefix, {})
                first = spine[len(prefix)] if spine[:len(prefix)] == prefix and len(spine) > len(prefix) else None
                order = sorted(counts, key=lambda t: (t != first, -counts[t]))
                for token in order[:self.tree.branch]:
                    child = tree.add(node, token, math.log(counts[token] / total))
                    deeper.append((child, prefix + (token,), counts[token]))
            level = deeper
        order, parents = tree.layout(tree.select(self.tree.budget, width))
        tokens = torch.tensor([tree.token[i] for i in order], dtype=torch.long, device=context.device)
        return Draft(tokens, torch.ones(tokens.shape[0], device=context.device), parents=parents)


@dataclass(frozen=True)
class LookupDraft(DraftSpec):
    """Prompt lookup: copy what followed the last n-gram's earlier occurrence (no forwards).

    A token tree merges the continuations of all matches when the context asks for one.

    Attributes:
        max_ngram: longest n-gram matched (HF `max_matching_ngram_size`, default 2).
        min_ngram: shortest n-gram tried.
    """

    drafts_trees: ClassVar[bool] = True

    max_ngram: int = bounded(2, most=64, scales="work")
    min_ngram: int = bounded(1, most=64, scales="work")

    def __post_init__(self) -> None:
        LookupDrafter(self.max_ngram, self.min_ngram)          # the drafter's own range checks

    def build(self, context: DraftContext) -> Built:
        return Built(LookupDrafter(self.max_ngram, self.min_ngram, context.tree), None)
