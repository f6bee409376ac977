"""Staged speculative decoding: the draft model's own generation is itself speculated.

Spector & Ré 2023 (arXiv 2308.04623), second stage: the draft (their 40M GPT-2) is sped up by a
cheaper drafter (a Katz back-off trigram), i.e. stage 1 with (target, draft) := (draft, draft2).
Here the first stage is any model drafter and the second any drafter (prompt lookup, a layer
subset of the draft, another model, or a staged drafter again); the inner rounds use the same
`verify_round` as the outer loop, with the first stage's model as their target. Inner
verification is exact, so the first stage's chain keeps the draft model's own law (its greedy
chain, or a sample from it) and only costs fewer draft forwards; exactness with respect to the
outer target is untouched: the outer round verifies whatever the first stage drafted.

Tree (the first stage's `tree`): the spine is the staged chain; each depth also proposes the
first stage's `branch - 1` most probable other tokens as leaves. Their distributions come from
the inner verification forwards, so the leaves cost nothing (Staged SD: "leaves are free").
"""

from __future__ import annotations

import math
from collections.abc import Callable
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.speculative.drafters.base import Draft, Drafter, cut_at_eos
from dllm_decode.speculative.drafters.layerskip import LayerSkipDraft
from dllm_decode.speculative.drafters.lookup import LookupDraft
from dllm_decode.speculative.drafters.model import ModelDraft, ModelDrafter
from dllm_decode.speculative.drafters.spec import Built, DraftContext, DraftSpec, NoDraft
from dllm_decode.speculative.loop import verify_round
from dllm_decode.speculative.sampling import Sampling
from dllm_decode.speculative.tree import TreeBuilder


@dataclass(frozen=True, eq=False)
class StagedDrafter(Drafter):
    """Draft with `first` (a model drafter) whose tokens are proposed by `second` and verified by
    `first`'s model in one forward per inner round.

    Attributes:
        first: the stage-1 draft (its model verifies the second stage; its `tree` adds leaves).
        second: the stage-2 drafter (any `Drafter`).
    """

    first: ModelDrafter
    second: Drafter

    def __post_init__(self) -> None:
        if not isinstance(self.first, ModelDrafter):
            raise TypeError(f"the first stage must be a ModelDrafter (it verifies the second "
                            f"stage with its model), got {type(self.first).__name__}")

    def init_state(self) -> tuple[Any, Any]:
        return self.first.init_state(), self.second.init_state()

    def propose(self, context: Tensor, width: int, sampling: Sampling,
                generator: torch.Generator | None, eos_ids: tuple[int, ...], state: Any,
                stop: Callable[[Draft], bool] | None = None) -> tuple[Draft, Any]:
        kv, inner = state
        tokens: list[Tensor] = []
        rows: list[Tensor] = []         # the first stage's logits at each drafted token
        forwards = 0
        done = 0
        while done < width:
            helper = Draft.empty(context.device)
            if width - done > 1:        # each inner round adds one token of the first stage's own
                helper, inner = self.second.propose(torch.cat([context, *tokens]), width - done - 1,
                                                    sampling, generator, eos_ids, inner)
                forwards += helper.forwards
            new, _, kv, logits = verify_round(self.first.model, kv, torch.cat([context, *tokens]),
                                              helper, sampling, generator)
            forwards += 1
            keep = cut_at_eos(new, eos_ids)
            tokens.append(new[:keep])
            rows.append(logits[:keep])
            done += keep
            if eos_ids and int(new[keep - 1]) in eos_ids:        # nothing after end-of-text
                break
            if stop is not None and done < width and stop(self._chain(tokens, rows, sampling, 0)):
                break
        draft = self._chain(tokens, rows, sampling, forwards)
        if self.first.tree is not None and not self.first.tree.is_chain:
            draft = self._with_leaves(draft, width)
        return draft, (kv, inner)

    @staticmethod
    def _chain(tokens: list[Tensor], rows: list[Tensor], sampling: Sampling, forwards: int) -> Draft:
        drafted, logits = torch.cat(tokens), torch.cat(rows)
        q = sampling.probs(logits)
        confidence = q.gather(-1, drafted.unsqueeze(-1)).squeeze(-1)
        return Draft(drafted, confidence, None if sampling.greedy else q, q, forwards)

    def _with_leaves(self, chain: Draft, width: int) -> Draft:
        """The chain plus, at each depth, the `branch - 1` most probable other tokens (one-hot
        laws: deterministic given the chain), kept by value up to the budget."""
        shape = self.first.tree
        q = chain.view
        others = q.scatter(-1, chain.tokens.unsqueeze(-1), -1.0).topk(shape.branch - 1, dim=-1)
        spine_tokens, spine_conf = chain.tokens.tolist(), chain.confidence.tolist()
        alt_tokens, alt_conf = others.indices.tolist(), others.values.tolist()
        tree = TreeBuilder()
        source: list[tuple[int, int]] = []          # node -> (depth row, token)
        parent = -1
        for depth, (token, c) in enumerate(zip(spine_tokens, spine_conf)):
            node = tree.add(parent, token, math.log(max(c, 1e-30)))
            source.append((depth, token))
            for alt, a in zip(alt_tokens[depth], alt_conf[depth]):
                if a > 0.0:
                    tree.add(parent, alt, math.log(a))
                    source.append((depth, alt))
            parent = node
        order, parents = tree.layout(tree.select(shape.budget, width, shape.min_value))
        if parents is None:
            return chain.head(len(order))
        depth_rows = torch.tensor([source[n][0] for n in order], device=q.device)
        tokens = torch.tensor([source[n][1] for n in order], device=q.device)
        view = q[depth_rows]
        confidence = view.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        probs = None
        if chain.probs is not None:                 # sampled spine, one-hot leaves
            spine = set(tree.spine())
            on_spine = torch.tensor([n in spine for n in order], device=q.device)
            one_hot = torch.nn.functional.one_hot(tokens, q.shape[-1]).to(q.dtype)
            probs = torch.where(on_spine.unsqueeze(-1), view, one_hot)
        return Draft(tokens, confidence, probs, view, chain.forwards, parents)


@dataclass(frozen=True)
class StagedDraft(DraftSpec):
    """A draft model sped up by a cheaper drafter (Staged speculative decoding, stage 2).

    Both stages are `DRAFTERS` entries, configured as nested options:
    `first=ar_draft second=lookup second.max_ngram=3`. A deeper chain nests `second`:
    `second=staged second.first=... second.second=...`. The second stage is built with the first
    stage's model in the target's place (so `first=ar_draft second=layerskip
    second.layers=1` skips layers of the draft); the context's tree shape goes to every stage
    that can draft a tree.

    Attributes:
        first: a `model` or `layerskip` draft (its model verifies the second stage).
        second: any drafter but `none`.
    """

    drafts_trees: ClassVar[bool] = True

    first: DraftSpec = field(default_factory=ModelDraft)
    second: DraftSpec = field(default_factory=LookupDraft)

    def __post_init__(self) -> None:
        from dllm_decode.registry import name_of

        if not isinstance(self.first, (ModelDraft, LayerSkipDraft)):
            raise ValueError(f"the first stage (first) must be a draft model or layerskip (it "
                             f"verifies the second stage), got {name_of(self.first)!r}")
        if not isinstance(self.second, DraftSpec) or isinstance(self.second, NoDraft):
            raise ValueError(f"the second stage (second) cannot be `{name_of(self.second)}`; "
                             f"give any drafter but none (none is the first stage alone)")

    def build(self, context: DraftContext) -> Built:
        first, source = self.first.build(context)
        second, _ = self.second.build(dataclasses.replace(context, target=source))
        return Built(StagedDrafter(first, second), source)
