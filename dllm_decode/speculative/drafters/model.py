"""A small causal LM drafts autoregressively (Leviathan et al. 2023; HF `AssistedCandidateGenerator`),
a chain or a token tree (EAGLE-2's expand-then-rerank, arXiv 2406.16858; Staged speculative
decoding's tree batch, Spector & Ré 2023, arXiv 2308.04623)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from dllm_decode.speculative.drafters.base import Draft, Drafter
from dllm_decode.speculative.drafters.spec import Built, DraftContext, DraftSpec, same_vocabulary
from dllm_decode.speculative.kv import KV, extend, feed, new_kv, rollback
from dllm_decode.speculative.sampling import Sampling
from dllm_decode.speculative.tree import TreeBuilder, TreeShape


@dataclass(frozen=True, eq=False)
class ModelDrafter(Drafter):
    """Draft up to `width` levels with a causal LM that shares the target's tokenizer.

    The draft samples with the target's own `Sampling` and reports that warped distribution as
    q (the fix of HF #32867/#47932: a greedy or raw-logit q under a sampling target is not
    lossless). Under greedy decoding the draft is deterministic and q is not needed. Its KV cache
    follows the accepted context by common-prefix rollback, so rejected drafts never leak in.

    Tree (`tree` with branch > 1): one draft forward per depth, as for a chain, but over up to
    `branch` frontier nodes under a tree mask, so leaves cost nothing (Staged SD: "the number of
    draft batches equals the tree depth"). Each expanded node proposes `branch` children: the
    spine's next token (the chain's: argmax, or a sample from q when sampling) first, then the
    most probable other tokens, which are deterministic (one-hot laws, so any selection of them
    keeps recursive rejection sampling exact; a sampled child could only be kept
    unconditionally). Per depth the spine node and the `branch - 1` most probable other
    candidates are expanded; the round keeps the spine and then the most probable nodes up to
    `budget` (`TreeBuilder.select`).

    Attributes:
        model: a transformers causal LM (or anything with the same forward signature).
        tree: the tree's shape; None (or branch 1) drafts a chain.
    """

    model: nn.Module
    tree: TreeShape | None = None

    def init_state(self) -> KV:
        return new_kv(self.model)

    def propose(self, context: Tensor, width: int, sampling: Sampling,
                generator: torch.Generator | None, eos_ids: tuple[int, ...], state: Any,
                stop: Callable[[Draft], bool] | None = None) -> tuple[Draft, Any]:
        shape = self.tree or CHAIN
        base = context.shape[0]
        logits, state = extend(self.model, state, context, 1)
        grow = _Growth(sampling, generator)
        frontier, fed, forwards = [-1], [], 1
        for depth in range(width):                # one forward per depth: autoregressive
            grow.expand(frontier, logits, shape)
            if depth + 1 == width or (stop is not None and stop(grow.draft(grow.tree.spine(), None))):
                break
            frontier = grow.next_frontier(depth, shape, eos_ids)
            if not frontier:                      # the spine drafted end-of-text
                break
            logits, state = self._feed(state, base, fed, frontier, grow.tree)
            fed += frontier
            forwards += 1
        # The last level is never fed (the next round's `extend` feeds what it needs). Keep the
        # fed rows that continue the context in order (the spine's, fed before any other node's).
        spine = grow.tree.spine()
        linear = 0
        while linear < len(fed) and fed[linear] == spine[linear]:
            linear += 1
        state = rollback(state, base + linear)
        budget = len(grow.tree) if self.tree is None else shape.budget
        order, parents = grow.tree.layout(grow.tree.select(budget, width, shape.min_value))
        if not order:
            return Draft.empty(context.device, forwards), state
        draft = grow.draft(order, parents)
        return Draft(draft.tokens, draft.confidence, draft.probs, draft.view, forwards, parents), state

    def _feed(self, state: KV, base: int, fed: list[int], frontier: list[int],
              tree: TreeBuilder) -> tuple[Tensor, KV]:
        """One draft forward over the frontier nodes, whose rows then follow the fed ones: each
        attends to the context, its fed ancestors and itself, at position base + depth."""
        device = state.ids.device
        tokens = torch.tensor([tree.token[node] for node in frontier], dtype=torch.long, device=device)
        if len(frontier) == 1 and tree.parent[frontier[0]] == (fed[-1] if fed else -1) \
                and all(tree.parent[a] == (fed[i - 1] if i else -1) for i, a in enumerate(fed)):
            return feed(self.model, state, tokens, 1)          # a chain: plain causal feed
        row_of = {node: base + i for i, node in enumerate(fed)}
        rows, cols = [], []
        for i, node in enumerate(frontier):
            ancestor = tree.parent[node]
            while ancestor >= 0:
                rows.append(i)
                cols.append(row_of[ancestor])
                ancestor = tree.parent[ancestor]
            rows.append(i)
            cols.append(base + len(fed) + i)
        mask = torch.zeros(len(frontier), base + len(fed) + len(frontier), dtype=torch.bool, device=device)
        mask[:, :base] = True
        mask[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = True
        positions = torch.tensor([base + tree.depth[node] for node in frontier], device=device)
        return feed(self.model, state, tokens, len(frontier), positions, mask)


CHAIN = TreeShape(branch=1, budget=512)


class _Growth:
    """A draft tree under construction, plus for each node: its parent's q row (what the
    scheduler is shown), whether it was sampled from that row (else deterministic: a one-hot
    law) and its confidence q(token)."""

    def __init__(self, sampling: Sampling, generator: torch.Generator | None):
        self.tree = TreeBuilder()
        self.sampling, self.generator = sampling, generator
        self.q: list[Tensor] = []
        self.sampled: list[bool] = []
        self.confidence: list[float] = []

    def expand(self, frontier: list[int], logits: Tensor, shape: TreeShape) -> None:
        """Children of every frontier node from its row of (m, V) next-token logits: the first
        is the argmax (greedy) or, on the spine, a sample from q; the others are the most
        probable remaining tokens, in decreasing probability, kept while their path probability
        reaches `shape.min_prob` (the spine's child always)."""
        branch, floor = shape.branch, shape.min_value
        q = self.sampling.probs(logits)
        spine = self.tree.spine()
        anchor = spine[-1] if spine else -1                    # the node the spine grows from
        spine_row = frontier.index(anchor) if anchor in frontier else None
        sampled_row = None
        if branch == 1 or not self.sampling.greedy:
            picks = logits.argmax(-1, keepdim=True)            # first index on ties, as greedy AR
            if not self.sampling.greedy and spine_row is not None:
                drawn, _ = self.sampling.draw(logits[spine_row:spine_row + 1], self.generator)
                picks[spine_row, 0] = drawn[0]
                sampled_row = spine_row
            if branch > 1:                                     # the most probable others
                others = q.scatter(-1, picks, -1.0).topk(branch - 1, dim=-1).indices
                picks = torch.cat([picks, others], -1)
            conf = q.gather(-1, picks)
        else:
            conf, picks = q.topk(branch, dim=-1)
        tokens, conf_list = picks.tolist(), conf.tolist()      # one host sync per depth
        tree = self.tree
        for row, node in enumerate(frontier):
            above = tree.value[node] if node >= 0 else 0.0
            for rank, (token, c) in enumerate(zip(tokens[row], conf_list[row])):
                if c <= 0.0 or (rank and above + math.log(c) < floor):
                    break                      # outside top-k/top-p, or too improbable to verify
                if not rank and above + math.log(c) < floor and row != spine_row:
                    break
                tree.add(node, token, math.log(c))
                self.q.append(q[row])
                self.sampled.append(rank == 0 and row == sampled_row)
                self.confidence.append(c)

    def next_frontier(self, depth: int, shape: TreeShape, eos_ids: tuple[int, ...]) -> list[int]:
        """Nodes at `depth` to expand next: the spine's, then the most probable others above
        `shape.min_prob` (none once the spine drafted end-of-text: nothing after it is verified)."""
        tree = self.tree
        spine = tree.spine()
        if len(spine) <= depth or tree.token[spine[depth]] in eos_ids:
            return []
        if shape.branch == 1:
            return [spine[depth]]
        floor = shape.min_value
        others = [n for n in tree.levels[depth] if n != spine[depth] and tree.value[n] >= floor
                  and tree.token[n] not in eos_ids]
        others.sort(key=lambda n: -tree.value[n])
        return [spine[depth]] + others[:shape.branch - 1]

    def draft(self, nodes: list[int], parents: tuple[int, ...] | None) -> Draft:
        """A `Draft` of the builder's `nodes` laid out with `parents` (forwards not counted)."""
        view = torch.stack([self.q[n] for n in nodes])
        tokens = torch.tensor([self.tree.token[n] for n in nodes], dtype=torch.long, device=view.device)
        confidence = torch.tensor([self.confidence[n] for n in nodes], device=view.device)
        probs = None
        if not self.sampling.greedy:
            one_hot = torch.nn.functional.one_hot(tokens, view.shape[-1]).to(view.dtype)
            sampled = torch.tensor([self.sampled[n] for n in nodes], device=view.device)
            probs = torch.where(sampled.unsqueeze(-1), view, one_hot)
        return Draft(tokens, confidence, probs, view, 0, parents)


@dataclass(frozen=True)
class ModelDraft(DraftSpec):
    """A smaller causal LM that shares the target's tokenizer drafts autoregressively.

    It drafts a chain, or a token tree when the context asks for one, and runs as the context's
    draft runtime says.

    Attributes:
        model: a `load_causal_lm` name: `ar_draft` (shipped), `smollm2` (fetched GGUF), a
            checkpoint directory, a `.gguf` file or a repo id in the local HF cache.
    """

    drafts_trees: ClassVar[bool] = True

    model: str = "ar_draft"

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise ValueError("model must name a causal LM (e.g. ar_draft), got ''")

    def build(self, context: DraftContext) -> Built:
        from dllm_decode.models.causal import load_causal_lm
        from dllm_decode.speculative.compact import with_runtime

        loaded = load_causal_lm(self.model, device=context.device)
        model = with_runtime(loaded, context.runtime)
        same_vocabulary(context.target, model.config.vocab_size)
        return Built(ModelDrafter(model, context.tree), loaded)
