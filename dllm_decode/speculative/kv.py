"""A causal LM's KV cache as explicit state: the transformers cache plus the tokens it holds.

The cache is a transformers `Cache` object (`DynamicCache`), never the legacy tuple of per-layer
(key, value) pairs, and it is passed under the name the model's forward declares:
`cache` (transformers 5.24 and later, which deprecate `past_key_values` for removal in 5.40)
or `past_key_values` (earlier releases), so no transformers release in the supported range
prints a deprecation warning. Supported: transformers 4.56 to 5.x (the layered `DynamicCache`
with `config=` and per-layer `crop`, and `from_pretrained(dtype=)`, arrived in 4.56); the
speculative tests pass on 4.56.0, 4.57.6, 5.0.0 and 5.24.0.

The loop and the model drafters keep one `KV` per model and request. `extend` feeds only the part
of a context the cache lacks (after cutting the cache back to the longest common prefix, which
is how a drafter's cache follows whatever the target accepted); `rollback` is the target's
explicit cut after a verification (`DynamicCache.crop`, as HF's assisted generation cuts it)
and `keep_path` its tree form (gather the accepted path's rows, then cut).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.devices import device_of
from dllm_decode.speculative.tree import tree_attention
from dllm_decode.speculative.verify import leading_run


@dataclass
class KV:
    """State of one model for one request.

    Attributes:
        cache: a transformers cache supporting `crop` (a `DynamicCache`).
        ids: (n,) long tokens whose keys/values the cache holds, in order.
    """

    cache: Any
    ids: Tensor


def new_kv(model: Any) -> KV:
    """An empty cache for `model`: its own (`new_cache()`, e.g. `CompactCausalLM`) or a transformers
    `DynamicCache` (both can be rolled back)."""
    if hasattr(model, "new_cache"):
        cache = model.new_cache()
    else:
        from transformers import DynamicCache

        config = getattr(model, "config", None)
        cache = DynamicCache(config=config) if config is not None else DynamicCache()
    return KV(cache=cache, ids=torch.zeros(0, dtype=torch.long, device=device_of(model)))


def rollback(kv: KV, length: int) -> KV:
    """Keep the first `length` cached positions (drop rejected drafts)."""
    drop = kv.ids.shape[0] - length
    if drop > 0:
        _crop(kv.cache, length)
        kv.ids = kv.ids[:length]
    return kv


def _crop(cache: Any, length: int) -> None:
    """Cut every filled layer of `cache` back to `length` positions.

    A negative `crop` argument removes that many positions; it means the same in transformers
    4.x (where a positive one is a target length) and 5.x (where a positive one is refused). A
    transformers cache is cut layer by layer, skipping layers that hold nothing (a layer-skip
    draft leaves the skipped layers empty, and transformers 4.x's whole-cache `crop` fails on
    them); a cache of its own (`CompactCache`) is cut whole.
    """
    layers = getattr(cache, "layers", None)
    if layers is None:
        if cache.get_seq_length() > length:
            cache.crop(-(cache.get_seq_length() - length))
        return
    for layer in layers:
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.numel() and layer.get_seq_length() > length:
            layer.crop(-(layer.get_seq_length() - length))


def extend(model: Any, kv: KV, context: Tensor, keep: int,
           tree: tuple[int, ...] | None = None) -> tuple[Tensor, KV]:
    """Logits for the last `keep` positions of `context`, reusing the cached common prefix.

    Args:
        model: a transformers causal LM (`input_ids`, `cache`, `logits_to_keep`) or a
            `CompactCausalLM`.
        kv: the model's state for this request.
        context: (n,) long, the whole sequence so far (prompt, accepted tokens, drafts).
        keep: 1 <= keep <= n, number of trailing positions whose next-token logits are wanted.
        tree: the parent array of a token tree that forms the last `keep - 1` tokens of
            `context` (flattened breadth-first, `dllm_decode.speculative.tree`); None when the
            context is a plain sequence (a chain draft included).
    Returns:
        (keep, V) float32 logits (row i predicts the token after position n - keep + i; for a
        tree, row 0 the root's and row i + 1 node i's next token) and the updated state, whose
        cache then holds all of `context` (tree nodes at rows in flattened order).
    """
    limit = context.shape[0] - keep                      # positions that may come from the cache
    shared = min(kv.ids.shape[0], limit)
    prefix = leading_run(kv.ids[:shared] == context[:shared]) if shared else 0
    kv = rollback(kv, prefix)
    if tree is None:
        return feed(model, kv, context[prefix:], keep)
    tail = context.shape[0] - len(tree) - prefix
    positions, mask = tree_attention(tree, prefix, tail, context.device)
    return feed(model, kv, context[prefix:], keep, positions, mask)


def feed(model: Any, kv: KV, tokens: Tensor, keep: int, positions: Tensor | None = None,
         mask: Tensor | None = None) -> tuple[Tensor, KV]:
    """One forward on `tokens` appended after the cached ones; logits of the last `keep` of them.

    `positions` ((q,) long) and `mask` ((q, cached + q) bool, True = attend) replace the causal
    defaults (token trees); without them the tokens continue the cached sequence causally.
    """
    extra = {}
    if mask is not None:
        extra = {"attention_mask": _model_mask(model, mask), "position_ids": positions.unsqueeze(0)}
    extra[cache_argument(type(model))] = kv.cache
    out = model(input_ids=tokens.unsqueeze(0), use_cache=True, logits_to_keep=keep, **extra)
    kv.ids = torch.cat([kv.ids, tokens])
    return out.logits[0, -keep:].float(), kv


@functools.lru_cache(maxsize=64)
def cache_argument(model_type: type) -> str:
    """The keyword a causal LM class's forward takes its cache under: `cache` where the forward
    declares it (transformers >= 5.24 and the compact runtime), else `past_key_values`."""
    try:
        parameters = inspect.signature(model_type.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def keep_path(kv: KV, start: int, path: list[int]) -> KV:
    """After verifying a tree fed at cache row `start`: keep the rows of the accepted `path`
    (node indices) at rows start, start + 1, ... and drop the rest (Medusa's
    `update_inference_inputs`: a gather, then the length). The kept
    keys were rotated at `start + depth`, their final positions, so nothing is re-rotated. A path
    that is already in place (a chain's accepted prefix) is a plain rollback."""
    if path != list(range(len(path))):
        rows = torch.tensor(path, dtype=torch.long, device=kv.ids.device) + start
        _gather(kv.cache, start, rows)
        ids = kv.ids.clone()
        ids[start:start + len(path)] = kv.ids[rows]
        kv.ids = ids
    return rollback(kv, start + len(path))


def _gather(cache: Any, start: int, rows: Tensor) -> None:
    """Copy cache rows `rows` to `start`, `start + 1`, ... in every layer (the length is then
    cut by `rollback`)."""
    if hasattr(cache, "gather"):
        cache.gather(start, rows)
        return
    for layer in cache.layers:                          # transformers DynamicCache
        if getattr(layer, "is_initialized", True) and getattr(layer, "keys", None) is not None \
                and layer.keys.numel():
            end = start + rows.shape[0]
            layer.keys[..., start:end, :] = layer.keys[..., rows, :]     # the index copies first
            layer.values[..., start:end, :] = layer.values[..., rows, :]


def _model_mask(model: Any, mask: Tensor) -> Tensor:
    """(q, k) bool -> the (1, 1, q, k) custom mask the model's attention takes: bool for SDPA
    (and the compact runtime), additive float for eager attention.

    Raises:
        ValueError: an attention implementation that takes no arbitrary mask (flash attention).
    """
    mask = mask[None, None]
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa")
    if hasattr(model, "new_cache") or implementation in (None, "sdpa"):
        return mask
    if implementation == "eager":
        dtype = next(model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min)
    raise ValueError(f"token-tree verification needs SDPA or eager attention (a custom mask); "
                     f"this model uses {implementation!r}")

