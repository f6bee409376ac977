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
products (tokens unchanged; `tests/test_encoder_prefix.py`).

A low-precision encoder cache (`kv_cache_dtype` fp8 / int8) stores its codes and scales as the
cache holds them (never quantized again). There reuse is not float-exact: without it a prompt's
later tokens attend its earlier ones in float (one encoder pass); with it they attend the stored
codes dequantized, as the loop's later canvases do. Values are kept apart by namespace: this
mode, the row's unmerged LoRA adapter and the store's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor


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
    newly admitted request's prompt is encoded through `encode` (see the module docstring)."""

    mode = "encoder"

    def __init__(self, sharing: Any, chunk: int):
        self.sharing, self.chunk = sharing, chunk       # the engine's `prefix_reuse.PrefixSharing`

    def restore(self, batch: Any, state: Any) -> Any:
        """At an admission: the newcomers (no encoder cache yet) will encode their prompts here."""
        for member in batch.members:
            if member.noise is not None and member.noise.encoder is None:
                member.noise.prefix = self
        return state

    def remember(self, state: Any) -> None:
        """Nothing: `encode` stores as it encodes."""

    def encode(self, model: Any, member: Any, ids: Tensor, mask: Tensor | None) -> Any:
        """Request `member`'s (b, L) prompt `ids` (`mask`: its padding, None: none) encoded after
        the K/V of its longest stored prefix of whole chunks (common to its rows); the chunks the
        store lacks are stored. Returns its `EncoderCache`."""
        store = getattr(model, "kv_store", None)
        sharing = self.sharing
        if mask is not None and not bool(mask.all()):      # padded: K/V depend on the padding
            sharing.admitted(member.key, 0)
            return model.encode(ids, mask)
        namespace = (self.mode, member.adapter, getattr(store, "dtype", "auto"))
        b, n, c = ids.shape[0], ids.shape[1], self.chunk
        keys = [[tuple(row[k:k + c]) for k in range(0, n - n % c, c)] for row in ids.tolist()]
        found = [sharing.store.match(namespace, row) for row in keys]
        reused = min(len(f) for f in found)
        sharing.admitted(member.key, reused * c)
        sharing.restored_tokens += reused * c * b
        cache = seeded(model, [f[:reused] for f in found], c, store, ids.device) if reused else None
        fresh: list[Any] = []
        if reused * c < n:
            cache = model.encode(ids[:, reused * c:], mask if cache is None else None, cache, fresh)
        for i, row in enumerate(keys):
            def value(k: int, i: int = i) -> tuple[tuple[Any, Any], ...]:
                if k < len(found[i]):                         # found, evicted since by another row
                    return found[i][k]
                columns = slice(k * c - reused * c, (k + 1) * c - reused * c)
                return tuple(tuple(_map(t, lambda x: x[i:i + 1, :, columns].clone()) for t in kv)
                             for kv in fresh)
            sharing.store.insert(namespace, row, value)
        return cache


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
