"""The cross-request prefix cache for a model with a causal encoder (DiffusionGemma): the
encoder K/V of a prompt's whole chunks, kept in the engine's `PrefixStore`, seed the encoder
cache of a later request whose prompt starts with the same chunks, so only the rest is encoded.

Exact: the encoder is causal, so the K/V of a prompt's first r tokens at every layer depend on
those r tokens and their positions only (vLLM caches DiffusionGemma's prefix for the same
reason). Positions count from a request's column 0. Each request encodes its prompt with its
own padding; a padded row's real tokens sit later and a sliding window counts its padding
columns, so its K/V depend on the padding: a request with a padded row (several prompts of
different lengths) is neither served from the store nor stored. A server request (one prompt)
never is padded.

What is stored: per whole chunk of `chunk` tokens (the model's canvas length, its block grid)
and per row, every layer's K/V of those columns, sliding layers included (the encoder cache
itself keeps only their last W-1 columns, so `encode(fresh=)` hands over the full ones). A
request that finds r tokens builds its cache from them: full layers from every found chunk,
sliding layers from the last W-1 columns of the tail chunks, then encodes its remaining prompt
tokens after them, as the loop already encodes every committed canvas after the earlier ones.
The result equals encoding the whole prompt at once up to float rounding of differently shaped
products (tokens unchanged; `tests/test_encoder_prefix.py`). The committed canvases a request
encodes later (before each next canvas) are stored the same way, keyed by all its tokens from
column 0: a chat's next turn, which carries this turn's prompt and answer, reuses both, up to
the last whole chunk encoded (the last canvas is never encoded).

A low-precision encoder cache (`kv_cache_dtype` fp8 / int8) stores its codes and scales as the
cache holds them (never quantized again). There reuse is not float-exact: without it a prompt's
later tokens attend its earlier ones in float (one encoder pass); with it they attend the stored
codes dequantized, as the loop's later canvases do. Values are kept apart by namespace: this
mode, the row's unmerged LoRA adapter and the store's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.prefix_store import Chunk


def _map(t: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """`fn` on a float K/V tensor, or on the codes and scales of a stored one (`QuantizedKV`)."""
    return fn(t) if isinstance(t, Tensor) else t._replace(codes=fn(t.codes), scales=fn(t.scales))


def _cat(parts: Sequence[Any], dim: int) -> Any:
    first = parts[0]
    if isinstance(first, Tensor):
        return torch.cat(list(parts), dim)
    return first._replace(codes=torch.cat([p.codes for p in parts], dim),
                          scales=torch.cat([p.scales for p in parts], dim))


def _last(t: Any, width: int) -> Any:
    """The last `width` columns (none when 0), as a sliding window keeps them."""
    return _map(t, lambda x: x[:, :, x.shape[2] - width:])


class EncoderReuse:
    """A running batch's side of the prefix cache (`Decoding.reuse`) for a causal encoder: each
    newly admitted request encodes through a `RequestPrefix` of its own."""

    mode = "encoder"

    def __init__(self, sharing: Any, chunk: int):
        self.sharing, self.chunk = sharing, chunk       # the engine's `prefix_reuse.PrefixSharing`

    def restore(self, batch: Any, state: Any) -> Any:
        """At an admission: the newcomers (no encoder cache yet) will encode through the store."""
        for member in batch.members:
            if member.noise is not None and member.noise.encoder is None:
                member.noise.prefix = RequestPrefix(self.sharing, self.chunk)
        return state

    def remember(self, state: Any) -> None:
        """Nothing: a request stores as it encodes (`RequestPrefix`)."""


@dataclass
class RequestPrefix:
    """One request's encoder passes through the store: its prompt after the longest stored
    prefix, then each committed canvas; every whole chunk encoded is stored (its rows' tokens
    from column 0 are the key).

    Attributes:
        chunks: per row, the whole chunks encoded so far (the key of the next one's parent).
        tail: per row, the tokens encoded after them (fewer than a chunk), and `tail_kv` per
            layer their (keys, values) as the cache keeps them, rows stacked.
        storing: False once the request cannot store (padded rows, rows that left).
    """

    sharing: Any
    chunk: int
    chunks: list[list[Chunk]] = field(default_factory=list)
    tail: list[list[int]] = field(default_factory=list)
    tail_kv: list[tuple[Any, Any]] = field(default_factory=list)
    storing: bool = True

    def encode(self, model: Any, member: Any, ids: Tensor, mask: Tensor | None, cache: Any) -> Any:
        """`model.encode(ids, mask, cache)` through the store: the first call (the prompt, `cache`
        None) starts after the K/V of the longest stored prefix of whole chunks common to the
        rows; every call stores the whole chunks it completes. Returns the `EncoderCache`."""
        if cache is None:
            return self._prompt(model, member, ids, mask)
        if not self.storing or ids.shape[0] != len(self.chunks):    # rows left: keys no longer hold
            self.storing = False
            return model.encode(ids, mask, cache)
        fresh: list[Any] = []
        cache = model.encode(ids, mask, cache, fresh)
        self._store(model, member, ids.tolist(), fresh, known=[[] for _ in self.chunks])
        return cache

    def _prompt(self, model: Any, member: Any, ids: Tensor, mask: Tensor | None) -> Any:
        sharing, c = self.sharing, self.chunk
        if mask is not None and not bool(mask.all()):      # padded: K/V depend on the padding
            sharing.admitted(member.key, 0)
            self.storing = False
            return model.encode(ids, mask)
        rows, n = ids.tolist(), ids.shape[1]
        keys = [[tuple(row[k:k + c]) for k in range(0, n - n % c, c)] for row in rows]
        found = [sharing.store.match(_namespace(model, member), row) for row in keys]
        reused = min(len(f) for f in found)
        sharing.admitted(member.key, reused * c)
        sharing.restored_tokens += reused * c * len(rows)
        self.chunks = [row[:reused] for row in keys]
        cache = seeded(model, [f[:reused] for f in found], c, getattr(model, "kv_store", None),
                       ids.device) if reused else None
        fresh: list[Any] = []
        if reused * c < n:
            cache = model.encode(ids[:, reused * c:], mask if cache is None else None, cache, fresh)
        self._store(model, member, [row[reused * c:] for row in rows], fresh,
                    known=[f[reused:] for f in found])
        return cache

    def _store(self, model: Any, member: Any, rows: list[list[int]], fresh: list[Any],
               known: list[list[Any]]) -> None:
        """Store the whole chunks that the tail and the new columns (`rows`' tokens, `fresh`
        K/V) complete; keep the rest as the tail. `known`: per row, stored values of the first
        new chunks found in the store (kept, should another row evict them meanwhile)."""
        c = self.chunk
        kv = fresh if not self.tail_kv else [(_cat([old[0], new[0]], 2), _cat([old[1], new[1]], 2))
                                             for old, new in zip(self.tail_kv, fresh)]
        tokens = [tail + row for tail, row in zip(self.tail or [[] for _ in rows], rows)]
        whole = len(tokens[0]) // c
        namespace = _namespace(model, member)
        for i, row in enumerate(tokens):
            done = len(self.chunks[i])
            self.chunks[i] = self.chunks[i] + [tuple(row[k * c:(k + 1) * c]) for k in range(whole)]

            def value(k: int, i: int = i, done: int = done) -> Any:
                k -= done
                if k < 0:                                   # an earlier chunk, evicted since
                    return None
                if k < len(known[i]):
                    return known[i][k]
                columns = slice(k * c, (k + 1) * c)
                return tuple(tuple(_map(t, lambda x: x[i:i + 1, :, columns].clone()) for t in pair)
                             for pair in kv)
            self.sharing.store.insert(namespace, self.chunks[i], value)
        self.tail = [row[whole * c:] for row in tokens]
        self.tail_kv = [tuple(_map(t, lambda x: x[:, :, whole * c:].clone()) for t in pair) for pair in kv]


def _namespace(model: Any, member: Any) -> tuple[str, int, str]:
    """Values of another reuse mode, adapter or store dtype never mix."""
    return (EncoderReuse.mode, member.adapter, getattr(getattr(model, "kv_store", None), "dtype", "auto"))


def seeded(model: Any, rows: list[list[Any]], chunk: int, store: Any, device: Any) -> Any:
    """The `EncoderCache` of r = len(rows[0]) * `chunk` tokens from each row's stored chunks
    (per chunk, per layer (keys, values) of shape (1, H, chunk, D)): full layers keep every
    column, sliding layers the last W-1."""
    from dllm_decode.models.diffusion_gemma import EncoderCache

    window = model.config.sliding_window - 1
    tail = -(-window // chunk)                         # the chunks a sliding layer reads
    r = len(rows[0]) * chunk
    keys, values = [], []
    for layer, block in enumerate(model.model.decoder.layers):
        sliding = block.self_attn.sliding
        for out, part in ((keys, 0), (values, 1)):
            t = _cat([_cat([ch[layer][part] for ch in (row[-tail:] if sliding else row)], 2) for row in rows], 0)
            out.append(_last(t, min(window, r)) if sliding else t)
    mask = torch.ones(len(rows), r, dtype=torch.bool, device=device)
    return EncoderCache(keys, values, mask, r, False, store)
