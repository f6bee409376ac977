"""Token trees: how a tree of draft tokens is laid out, masked, positioned and pruned to a budget.

Staged speculative decoding (Spector & Ré 2023, arXiv 2308.04623) and SpecInfer (Miao et al.,
arXiv 2305.09781) verify a tree of candidate continuations in one target forward; Medusa and
EAGLE-2 (arXiv 2406.16858) build the same mask. Layout: nodes are
flattened breadth-first, every parent before its children and the siblings of a node in the order
they were proposed; `parents[i]` is node i's parent, -1 for the children of the root (the last
context token). A chain is `parents = (-1, 0, 1, ...)`, the width-1 special case, and is stored
as `None` so the hot path can skip the mask.

Each node attends to the cached prefix plus its own ancestors and itself, at position
`prefix_len + depth`; those are the positions the accepted nodes keep after the cache is
compacted, so cached keys need no re-rotation (`kv.keep_path`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.fields import check_types


@dataclass(frozen=True)
class TreeShape:
    """How wide a drafter's tree may grow (EAGLE-2's `top_k` and `total_token`).

    The spine (the first proposal at every depth: the chain a chain drafter would propose) is
    always in the tree; `branch` - 1 more candidates per expanded node and `branch` expanded
    nodes per depth add alternatives, and `budget` caps the nodes the target verifies per round.
    So at equal depth (equal draft forwards) a tree verifies a superset of the chain.

    A node off the spine is expanded or verified only if its path probability under the
    drafter (the product of the draft probabilities along it: the chance, for a calibrated draft,
    that the target walks there) is at least `min_prob`: each verified node costs target compute,
    and a node is worth about its path probability in accepted tokens.

    Attributes:
        branch: children proposed per expanded node, and nodes expanded per depth (1: a chain).
        budget: most nodes verified per round (the spine first, then the most probable others).
        min_prob: smallest path probability of a node off the spine, in [0, 1).
    """

    branch: int = 2
    budget: int = 24
    min_prob: float = 0.0

    def __post_init__(self) -> None:
        check_types(self)
        if not 1 <= self.branch <= 16:
            raise ValueError(f"tree branch must be in [1, 16], got {self.branch}")
        if not 1 <= self.budget <= 512:
            raise ValueError(f"tree budget must be in [1, 512], got {self.budget}")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"tree min_prob must be in [0, 1), got {self.min_prob}")

    @property
    def is_chain(self) -> bool:
        return self.branch == 1

    @property
    def min_value(self) -> float:
        """`min_prob` as a log-probability (the builder's node values)."""
        return math.log(self.min_prob) if self.min_prob > 0 else -math.inf


def depths(parents: Sequence[int]) -> list[int]:
    """0-based depth of every node (children of the root have depth 0)."""
    out: list[int] = []
    for parent in parents:
        out.append(0 if parent < 0 else out[parent] + 1)
    return out


def is_chain(parents: Sequence[int]) -> bool:
    return all(parent == i - 1 for i, parent in enumerate(parents))


def path_to(node: int, parents: Sequence[int]) -> list[int]:
    """The nodes from the root's child down to `node` (inclusive); [] for the root (-1)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def children_of(parents: Sequence[int]) -> dict[int, list[int]]:
    """parent -> its children in sibling order (the root is -1)."""
    out: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        out.setdefault(parent, []).append(node)
    return out


def spine(parents: Sequence[int]) -> list[int]:
    """The first child of the root, its first child, and so on (the chain inside the tree)."""
    first: dict[int, int] = {}
    for node, parent in enumerate(parents):
        first.setdefault(parent, node)
    out, node = [], first.get(-1)
    while node is not None:
        out.append(node)
        node = first.get(node)
    return out


def tree_attention(parents: Sequence[int], past: int, tail: int,
                   device: torch.device | str) -> tuple[Tensor, Tensor]:
    """Positions and mask for one forward over `tail` context tokens followed by a token tree.

    Args:
        parents: the tree's parent array (n nodes).
        past: positions already in the model's cache.
        tail: context tokens fed before the tree (causal among themselves).
    Returns:
        (tail + n,) long positions and a (tail + n, past + tail + n) bool mask (True = attend):
        context tokens are causal, a node sees the whole context plus its ancestors and itself.
    """
    n = len(parents)
    start = past + tail                                   # position of the root's children
    positions = torch.tensor(list(range(past, start)) + [start + d for d in depths(parents)],
                             dtype=torch.long, device=device)
    mask = torch.ones(tail + n, past + tail + n, dtype=torch.bool, device=device).tril(past)
    rows, cols = [], []
    for node in range(n):
        for ancestor in path_to(parents[node], parents):
            rows.append(tail + node)
            cols.append(start + ancestor)
    node_block = mask[tail:, start:]
    node_block.zero_()
    node_block.fill_diagonal_(True)
    if rows:
        mask[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = True
    return positions, mask


class TreeBuilder:
    """A growing tree on the host: nodes with a token, a parent, a sibling rank and a value
    (log-probability of the path under the drafter), then a budgeted selection and the
    breadth-first layout the verifier takes.

    Selection keeps the spine (the chain) up to the depth limit, then adds the highest-value
    nodes best-first (EAGLE-2's rerank, DDTree's heap) while every kept node's parent and
    previous sibling are kept (sibling order is proposal order, which the acceptance rule needs).
    """

    def __init__(self) -> None:
        self.token: list[int] = []
        self.parent: list[int] = []
        self.depth: list[int] = []
        self.value: list[float] = []
        self.kids: dict[int, list[int]] = {-1: []}
        self.levels: list[list[int]] = []           # depth -> its nodes
        self._spine: list[int] = []

    def __len__(self) -> int:
        return len(self.token)

    def add(self, parent: int, token: int, logq: float) -> int:
        """A new child of `parent` (-1: the root), after its existing children."""
        node = len(self.token)
        depth = 0 if parent < 0 else self.depth[parent] + 1
        self.token.append(token)
        self.parent.append(parent)
        self.depth.append(depth)
        self.value.append(logq + (self.value[parent] if parent >= 0 else 0.0))
        siblings = self.kids[parent]
        siblings.append(node)
        self.kids[node] = []
        if depth == len(self.levels):
            self.levels.append([])
        self.levels[depth].append(node)
        if len(siblings) == 1 and parent == (self._spine[-1] if self._spine else -1):
            self._spine.append(node)                # the first child of the spine's end
        return node

    def spine(self) -> list[int]:
        return self._spine

    def select(self, budget: int, max_depth: int, min_value: float = -math.inf) -> list[int]:
        """The nodes to verify: the spine (up to `max_depth` levels), then the best others whose
        value is at least `min_value`."""
        chosen = [node for node in self._spine if self.depth[node] < max_depth][:budget]
        taken = set(chosen)
        heap: list[tuple[float, int]] = []

        def offer(node: int) -> None:          # `node` may be taken once its parent and elder sibling are
            if node not in taken and self.depth[node] < max_depth and self.value[node] >= min_value:
                heapq.heappush(heap, (-self.value[node], node))

        for node in [-1, *chosen]:
            for kid in self.kids[node][:2]:     # first child, or the spine's next sibling
                offer(kid)
        while heap and len(chosen) < budget:
            _, node = heapq.heappop(heap)
            if node in taken:
                continue
            chosen.append(node)
            taken.add(node)
            siblings = self.kids[self.parent[node]]
            rank = siblings.index(node)
            if rank + 1 < len(siblings):
                offer(siblings[rank + 1])
            if self.kids[node]:
                offer(self.kids[node][0])
        return chosen

    def layout(self, chosen: Sequence[int]) -> tuple[list[int], tuple[int, ...] | None]:
        """Breadth-first order of the `chosen` nodes (builder indices) and their parent array in
        that order (None for a chain)."""
        index: dict[int, int] = {-1: -1}
        order: list[int] = []
        level = [-1]
        chosen_set = set(chosen)
        while level:
            nxt = []
            for node in level:
                for kid in self.kids[node]:
                    if kid in chosen_set:
                        index[kid] = len(order)
                        order.append(kid)
                        nxt.append(kid)
            level = nxt
        parents = tuple(index[self.parent[node]] for node in order)
        return order, None if is_chain(parents) else parents
