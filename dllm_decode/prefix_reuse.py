"""The cross-request prefix cache: the K/V of finished prompt (and answer) blocks, kept in a
`PrefixStore` shared by every request of an engine, seed the next batch that starts with the
same tokens, so its first forward starts after the reused columns.

When requests join a running batch, its cache starts afresh and the next forward recomputes
every row from its first token (`Decoding.step`). With sharing on, that step first looks up each
row's finished tokens (every whole grid block before its active block) in the store, copies the
K/V found into a new `KVCache` at the row's columns, and hands the cache state to the cache
(`Cache.resume`), so the forward feeds only the columns after the shortest reuse. After that
forward the same blocks of every row hold exact K/V, and the ones the store lacks are stored.

Exact only where a finished block's K/V cannot change: block-causal models (Fast-dLLM v2, SDAR,
LLaDA2, the shipped `embedded-bd`) under a cache that declares `prefix_reuse = "exact"` (the
`block` cache). There the K/V of block j depend on the tokens of blocks 0..j and their positions
(counted from a row's first real token, so left padding does not matter), not on anything later
or on other rows; a reused block therefore equals the recomputed one up to float rounding of
differently shaped products, and tokens are unchanged. Only whole blocks of the model's grid are
stored or matched (SGLang's block-level radix cache makes the same cut: sglang PR #18724), so
requests that share part of a block reuse only the blocks before it. A bidirectional model
(LLaDA, Dream) has no exact reuse: every prompt K/V depends on the canvas after it; no cache of
those models declares exact reuse, so by default requests there are served as before.

DiffusionGemma (a model declaring `encoder_reuse`) reuses exactly too, through its own hook
(`dllm_decode.encoder_reuse.EncoderReuse`): its causal encoder's K/V of a prompt's whole chunks
(its canvas length) are stored in the same store under their own namespace, a request's prompt
is encoded after the longest stored prefix, and the committed canvases it encodes later are
stored too; under any cache (its noise canvas keeps its own encoder cache).

Approximate mode (opt-in: `Engine(prefix_cache_approximate=N)`, `serve --prefix-cache-approximate
N`): a cache that declares `prefix_reuse = "approximate"` (Fast-dLLM's `prefix` cache) also
takes stored prompt K/V in chunks of N tokens, on any model. On a bidirectional model those K/V
were computed with another request's canvas after the prompt, so tokens may change; the
approximation is of the kind the cache already makes inside a block (it keeps prompt K/V
computed while the block was masked). Only prompt columns are stored, under their own
namespace, so exact and approximate values never mix.

Values are kept per namespace (the reuse mode and the row's unmerged LoRA adapter), so rows with
different adapters never share; a store belongs to one engine and so to one model, dtype and
quantization. Under tensor parallelism every rank's engine keeps its own store of its own head
shard; the ranks see the same requests and equal shard sizes, so they take the same decisions.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from dllm_decode.models.layers import KVCache
from dllm_decode.prefix_store import Chunk, PrefixStore


@dataclass(frozen=True)
class PrefixStats:
    """The engine's prefix-cache counters (`Engine.stats`, `/metrics`).

    Attributes:
        hits: requests admitted with at least one reused block.
        misses: requests admitted (under a cache that takes stored K/V) with none.
        reused_tokens: prompt tokens of admitted requests whose K/V came from the store.
        restored_tokens: every column restored, a running request's again when others join.
        budget_bytes, resident_bytes, entries, inserted, evicted: the store's (`StoreStats`).
    """

    hits: int
    misses: int
    reused_tokens: int
    restored_tokens: int
    budget_bytes: int
    resident_bytes: int
    entries: int
    inserted: int
    evicted: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class RowKey:
    """A batch row's finished tokens as store keys: its namespace, whole grid blocks, and the
    canvas column of its first real token."""

    namespace: Hashable
    chunks: list[Chunk]
    first: int


class PrefixSharing:
    """An engine's prefix cache: the store, each request's reused tokens until its answer takes
    them (`take`), and the counters. `hook(cache)` gives a running batch its `PrefixReuse`.

    Raises:
        ValueError: a budget that is not a positive integer.
    """

    def __init__(self, budget_bytes: int, approximate: int = 0):
        self.store = PrefixStore(budget_bytes)
        self.approximate = approximate          # chunk tokens of the approximate mode (0: off)
        self.cached: dict[Hashable, int] = {}
        self.hits = self.misses = self.reused_tokens = self.restored_tokens = 0

    def hook(self, model: Any, cache: Any) -> PrefixReuse | None:
        """The reuse hook of a batch decoding `model` with `cache` (None: no reuse there)."""
        if getattr(model, "encoder_reuse", False):          # a causal encoder: its prompt K/V
            from dllm_decode.encoder_reuse import EncoderReuse

            return EncoderReuse(self, model.canvas_length)
        if getattr(model, "kv_store", None) is not None:     # K/V kept in low precision: not
            return None                                      # float blocks this hook can copy
        kind, grid = getattr(cache, "prefix_reuse", None), getattr(model, "block_size", None)
        if kind == "exact" and grid:
            return PrefixReuse(self, cache, grid)
        if kind == "approximate" and self.approximate:
            return PrefixReuse(self, cache, self.approximate, "approximate")
        return None

    def admitted(self, key: Hashable, tokens: int) -> None:
        """A request's first restore: count it once."""
        if key in self.cached:
            return
        self.cached[key] = tokens
        self.reused_tokens += tokens
        if tokens:
            self.hits += 1
        else:
            self.misses += 1

    def take(self, key: Hashable) -> int:
        """The prompt tokens a finished (or cancelled) request reused; forgets it."""
        return self.cached.pop(key, 0)

    def stats(self) -> PrefixStats:
        s = self.store.stats()
        return PrefixStats(self.hits, self.misses, self.reused_tokens, self.restored_tokens,
                           s.budget_bytes, s.resident_bytes, s.entries, s.inserted, s.evicted)


class PrefixReuse:
    """One running batch's side of the prefix cache (`Decoding.reuse`): `restore` when the batch's
    cache starts afresh, `remember` after that step's forward (see the module docstring).
    `grid`: the chunk, the model's block (exact) or the approximate mode's tokens; an
    approximate hook keeps prompt columns only (its generated K/V never settle)."""

    def __init__(self, sharing: PrefixSharing, cache: Any, grid: int, mode: str = "exact"):
        self.sharing, self.cache, self.grid, self.mode = sharing, cache, grid, mode
        self.rows: list[RowKey] = []

    def restore(self, batch: Any, state: Any) -> Any:
        """The cache state for the batch's first forward after an admission: `state` (nothing
        found), or a `KVCache` holding every stored block of every row resumed after the
        shortest reuse."""
        self.rows = self._keys(batch)
        store, grid = self.sharing.store, self.grid
        found = [store.match(row.namespace, row.chunks) for row in self.rows]
        for g, rows in batch.groups.items():
            self.sharing.admitted(batch.members[g].key, len(found[rows[0]]) * grid)
        self.sharing.restored_tokens += sum(len(f) for f in found) * grid
        sample = next((values[0] for values in found if values), None)
        if sample is None:
            return state
        layers, _, heads, _, dim = sample.shape
        width = batch.rows.x.shape[1]
        keys = [sample.new_zeros(len(found), heads, width, dim) for _ in range(layers)]
        values = [sample.new_zeros(len(found), heads, width, dim) for _ in range(layers)]
        for i, (row, blocks) in enumerate(zip(self.rows, found)):
            if not blocks:
                continue
            kv = torch.cat(blocks, dim=3)                       # (layers, 2, H, n * grid, D)
            columns = slice(row.first, row.first + kv.shape[3])
            for layer in range(layers):
                keys[layer][i, :, columns] = kv[layer, 0]
                values[layer][i, :, columns] = kv[layer, 1]
        start = min(row.first + len(blocks) * grid for row, blocks in zip(self.rows, found))
        return self.cache.resume(KVCache(keys, values), start)

    def remember(self, state: Any) -> None:
        """After the first forward: store every row's finished blocks the store lacks."""
        kv, rows, self.rows = self.cache.kv_of(state), self.rows, []
        if kv is None or not kv.filled:
            return
        grid = self.grid
        for i, row in enumerate(rows):
            def block(k: int, i: int = i, first: int = row.first) -> torch.Tensor:
                columns = slice(first + k * grid, first + (k + 1) * grid)
                return torch.stack([torch.stack([key[i, :, columns], value[i, :, columns]])
                                    for key, value in zip(kv.keys, kv.values)])
            self.sharing.store.insert(row.namespace, row.chunks, block)

    def _keys(self, batch: Any) -> list[RowKey]:
        """Each row's finished whole grid blocks (before the block its region starts in), read
        from the canvas once (one host copy per admission)."""
        b, grid = batch.bounds, self.grid
        x = batch.rows.x.tolist()
        mask = None if batch.rows.attention_mask is None else batch.rows.attention_mask.tolist()
        out = []
        for i, region in enumerate(batch.region_starts()):
            first = b.gen_start[i] - b.prompt_length[i]
            settled = region if self.mode == "exact" else min(region, b.gen_start[i])
            end = first + (settled - first) // grid * grid
            if mask is not None and 0 in mask[i][first:end]:     # a cut column: stop before its block
                end = first + (mask[i].index(0, first) - first) // grid * grid
            tokens = x[i][first:end]
            chunks = [tuple(tokens[k:k + grid]) for k in range(0, len(tokens), grid)]
            out.append(RowKey((self.mode, batch.members[b.request[i]].adapter), chunks, first))
        return out
