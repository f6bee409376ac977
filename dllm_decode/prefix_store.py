"""A radix tree of per-chunk tensors keyed by token ids, shared across requests, evicted LRU under
a byte budget: the store behind the cross-request prefix cache.

A key is a sequence of chunks (tuples of token ids, one grid block each); a node holds the
value of one chunk (its K/V, in whatever layout the caller stores), reached from the root by the
chunks before it, so a value is found only under exactly the tokens it was computed from. Trees
are kept apart by a namespace (an adapter, a reuse mode): values of two namespaces never mix.
SGLang keys its dLLM radix cache the same way (pages of `block_size` tokens; sglang PR #18724),
Diffulex by chained hashes of full blocks; here the chunk tuples themselves are the edges, so
equal keys mean equal tokens (no hash collision to rule out).

Eviction removes the least recently used leaf until the resident bytes fit the budget. Every
access touches a path leaf first, so a parent is always more recent than its children and the
oldest node is a leaf. Values are copied out when used (`match` returns them; the caller copies
them into its own tensors), so evicting a node never changes a running request. The store knows
nothing of models: `dllm_decode.prefix_reuse` fills it with K/V, and any other cache whose
values are exact functions of a token prefix (a causal encoder's K/V) can use it the same way.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

Chunk = tuple[int, ...]


@dataclass(eq=False)
class Node:
    """One chunk of a key: its value, size, children and place in the LRU order."""

    chunk: Chunk
    value: Any
    nbytes: int
    parent: Node | None
    children: dict[Chunk, Node] = field(default_factory=dict)


@dataclass(frozen=True)
class StoreStats:
    """The store's counters.

    Attributes:
        budget_bytes: the most bytes the values may take.
        resident_bytes: bytes of the values held now.
        entries: chunks held now.
        inserted: chunks ever stored.
        evicted: chunks evicted to stay under the budget.
    """

    budget_bytes: int
    resident_bytes: int
    entries: int
    inserted: int
    evicted: int


def nbytes_of(value: Any) -> int:
    """The bytes of a tensor, of a record with `nbytes` (stored codes and scales), or of a
    list/tuple of them."""
    if isinstance(value, (list, tuple)) and not hasattr(value, "nbytes"):
        return sum(nbytes_of(v) for v in value)
    return int(value.nbytes)


class PrefixStore:
    """Chunked token prefixes -> values, LRU-evicted under `budget_bytes` (see the module).

    Not thread-safe: one engine thread owns it (reading `stats` from another thread is safe).

    Raises:
        ValueError: a budget that is not a positive integer.
    """

    def __init__(self, budget_bytes: int):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
            raise ValueError(f"the prefix store's budget must be a positive number of bytes, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self.roots: dict[Hashable, Node] = {}
        self.lru: collections.OrderedDict[int, Node] = collections.OrderedDict()   # id(node) -> node
        self.resident_bytes = 0
        self.inserted = 0
        self.evicted = 0

    def match(self, namespace: Hashable, chunks: Sequence[Chunk]) -> list[Any]:
        """The values of the longest stored prefix of `chunks` (one per matched chunk, in order);
        the matched path becomes the most recently used."""
        node, path = self.roots.get(namespace), []
        for chunk in chunks:
            node = None if node is None else node.children.get(chunk)
            if node is None:
                break
            path.append(node)
        self._touch(path)
        return [n.value for n in path]

    def insert(self, namespace: Hashable, chunks: Sequence[Chunk], value: Callable[[int], Any]) -> int:
        """Store `chunks` (a key from the root); `value(i)` makes chunk i's value, called only for
        chunks not yet stored (None: the caller has none, so nothing from chunk i on is stored).
        Then evict down to the budget (a chunk larger than the whole budget is not stored, nor
        anything after it). Returns the chunks newly stored."""
        node = self.roots.setdefault(namespace, Node((), None, 0, None))
        path, added = [], 0
        for i, chunk in enumerate(chunks):
            child = node.children.get(chunk)
            if child is None:
                made = value(i)
                size = 0 if made is None else nbytes_of(made)
                if made is None or size > self.budget_bytes:
                    break
                child = Node(chunk, made, size, node)
                node.children[chunk] = child
                self.resident_bytes += size
                self.inserted += 1
                added += 1
            path.append(child)
            node = child
        self._touch(path)
        self._evict()
        return added

    def stats(self) -> StoreStats:
        return StoreStats(self.budget_bytes, self.resident_bytes, len(self.lru), self.inserted, self.evicted)

    def clear(self) -> None:
        self.roots.clear()
        self.lru.clear()
        self.resident_bytes = 0

    # -- internals -----------------------------------------------------------------------------

    def _touch(self, path: list[Node]) -> None:
        """Most recent last, leaf first: each parent ends up more recent than its children."""
        for node in reversed(path):
            self.lru[id(node)] = node
            self.lru.move_to_end(id(node))

    def _evict(self) -> None:
        """Drop least recently used leaves until the values fit the budget (the oldest node is a
        leaf: see `_touch`; a longer key loses its tail first)."""
        while self.resident_bytes > self.budget_bytes and self.lru:
            self._remove(next(n for n in self.lru.values() if not n.children))

    def _remove(self, node: Node) -> None:
        del self.lru[id(node)]
        del node.parent.children[node.chunk]
        self.resident_bytes -= node.nbytes
        self.evicted += 1
        node.value = None
