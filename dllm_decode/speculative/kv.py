"""A causal LM's KV cache as explicit state: the transformers cache plus the tokens it holds.

The loop and the model drafters keep one `KV` per model and request. `extend` feeds only the part
of a context the cache lacks (after cutting the cache back to the longest common prefix, which
is how a drafter's cache follows whatever the target accepted); `rollback` is the target's
explicit cut after a verification (HF `DynamicCache.crop`, spec speculative.md §2.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

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
    return KV(cache=cache, ids=torch.zeros(0, dtype=torch.long, device=_device_of(model)))


def rollback(kv: KV, length: int) -> KV:
    """Keep the first `length` cached positions (drop rejected drafts)."""
    drop = kv.ids.shape[0] - length
    if drop > 0:
        if kv.cache.get_seq_length() > length:
            # A negative argument removes that many positions; it means the same in transformers
            # 4.x (where a positive one is a target length) and 5.x (where positive is refused).
            kv.cache.crop(-(kv.cache.get_seq_length() - length))
        kv.ids = kv.ids[:length]
    return kv


def extend(model: Any, kv: KV, context: Tensor, keep: int) -> tuple[Tensor, KV]:
    """Logits for the last `keep` positions of `context`, reusing the cached common prefix.

    Args:
        model: a transformers causal LM (`input_ids`, `past_key_values`, `logits_to_keep`).
        kv: the model's state for this request.
        context: (n,) long, the whole sequence so far (prompt, accepted tokens, drafts).
        keep: 1 <= keep <= n, number of trailing positions whose next-token logits are wanted.
    Returns:
        (keep, V) float32 logits (row i predicts the token after position n - keep + i) and the
        updated state, whose cache then holds all of `context`.
    """
    limit = context.shape[0] - keep                      # positions that may come from the cache
    shared = min(kv.ids.shape[0], limit)
    prefix = leading_run(kv.ids[:shared] == context[:shared]) if shared else 0
    kv = rollback(kv, prefix)
    return feed(model, kv, context[prefix:], keep)


def feed(model: Any, kv: KV, tokens: Tensor, keep: int) -> tuple[Tensor, KV]:
    """One forward on `tokens` appended after the cached ones; logits of the last `keep` of them."""
    out = model(input_ids=tokens.unsqueeze(0), past_key_values=kv.cache, use_cache=True,
                logits_to_keep=keep)
    kv.ids = torch.cat([kv.ids, tokens])
    return out.logits[0, -keep:].float(), kv


def _device_of(model: Any) -> torch.device:
    if isinstance(getattr(model, "device", None), torch.device):
        return model.device
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")
