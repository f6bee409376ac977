"""Pieces shared by the plain-torch LLaDA and Dream implementations: RMSNorm, RoPE, attention
against a block-level KV cache, default positions, the pre-norm block and the model skeleton.

The KV cache holds each layer's keys (already rotated) and values for the whole canvas. A forward
over canvas rows `[a, b)` writes its fresh K/V into those columns in place and attends over every
column: that single operation is both Fast-dLLM's dual cache (rows = the block) and its prefix
cache (rows = the block and the whole suffix).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn


@dataclass
class KVCache:
    """Per-layer keys (rotated) and values, each (B, Hkv, L, D). Empty until a full forward fills it."""

    keys: list[Tensor] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)

    @property
    def filled(self) -> bool:
        return bool(self.keys)

    def clear(self) -> None:
        self.keys.clear()
        self.values.clear()

    def select_rows(self, rows: Tensor) -> "KVCache":
        return KVCache([k.index_select(0, rows) for k in self.keys],
                       [v.index_select(0, rows) for v in self.values])

    def trim(self, width: int) -> "KVCache":
        """Keep the first `width` canvas columns (the loop cut the dead tail off the canvas)."""
        return KVCache([k[:, :, :width] for k in self.keys], [v[:, :, :width] for v in self.values])


class RMSNorm(nn.Module):
    """Llama ordering: normalise in float32, cast back to the input dtype, then scale."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Llama's RMSNorm: normalise in float32, cast back to `x`'s dtype, then scale by `weight`."""
    return weight * rms_normalize(x, eps)


def rms_normalize(x: Tensor, eps: float) -> Tensor:
    """RMSNorm without its scale (for callers that fold the scale into the next matrix)."""
    # Written out: F.rms_norm is a composite on CPU that costs ~4x these ops (measured).
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def default_positions(attention_mask: Tensor | None, batch: int, length: int, device) -> Tensor:
    """(B, L) positions counting only attended tokens, so left padding does not shift a row."""
    if attention_mask is None:
        return torch.arange(length, device=device).expand(batch, length)
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def rope_tables(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """float32 (B, 1, Lq, D) cos and sin for half-split (NeoX / HF-Llama) rotary embeddings."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                            dtype=torch.float32) / head_dim)
    angles = positions.float().unsqueeze(-1) * inv_freq                  # (B, Lq, D/2)
    angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)            # (B, 1, Lq, D)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, full_precision: bool) -> Tensor:
    """Rotate (B, H, Lq, D) `x`. LLaDA rotates in float32; Dream in the model dtype."""
    dtype = x.dtype
    if full_precision:
        x = x.float()
    else:
        cos, sin = cos.to(dtype), sin.to(dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(dtype)


def attend(q: Tensor, k: Tensor, v: Tensor, *, n_heads: int, n_kv_heads: int, cos: Tensor,
           sin: Tensor, key_mask: Tensor | None, kv: KVCache | None, layer: int,
           rows: tuple[int, int], rope_full_precision: bool) -> Tensor:
    """Bidirectional attention of the fed rows, optionally through the KV cache.

    Args:
        q, k, v: (B, Lq, H*D), (B, Lq, Hkv*D), (B, Lq, Hkv*D) projections of the fed rows.
        cos, sin: rotary tables for the fed rows.
        key_mask: (B, 1, 1, L) bool over all keys (True = attend) or None.
        kv: the cache; empty -> store this layer's K/V; filled -> write rows in place, attend all.
        rows: canvas columns `[a, b)` of the fed rows.
    Returns:
        (B, Lq, H*D) attention output.
    """
    q = rearrange(q, "b l (h d) -> b h l d", h=n_heads)
    k = rearrange(k, "b l (h d) -> b h l d", h=n_kv_heads)
    v = rearrange(v, "b l (h d) -> b h l d", h=n_kv_heads)
    q = apply_rope(q, cos, sin, rope_full_precision)
    k = apply_rope(k, cos, sin, rope_full_precision)
    if kv is not None:
        if len(kv.keys) <= layer:                       # refresh: this forward fed every row
            kv.keys.append(k)
            kv.values.append(v)
        else:                                           # cached step: replace the fed rows in place
            kv.keys[layer][:, :, rows[0]:rows[1]] = k
            kv.values[layer][:, :, rows[0]:rows[1]] = v
            k, v = kv.keys[layer], kv.values[layer]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask,
                                         enable_gqa=n_heads != n_kv_heads)
    return rearrange(out, "b h l d -> b l (h d)")


def key_mask_of(attention_mask: Tensor | None) -> Tensor | None:
    """(B, L) 0/1 mask -> (B, 1, 1, L) bool for SDPA; padded keys are never attended."""
    return None if attention_mask is None else attention_mask.bool()[:, None, None, :]


class PreNormBlock(nn.Module):
    """Llama-shaped block: x + attn(norm(x)), then x + down(silu(gate(norm(x))) * up(norm(x))).

    Subclasses create the weights under their checkpoint's names and return them from `parts()`;
    the maths is written once here.
    """

    def __init__(self, n_heads: int, n_kv_heads: int, rope_full_precision: bool):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.rope_full_precision = rope_full_precision

    def parts(self) -> tuple[nn.Module, ...]:
        """(attn_norm, q, k, v, attn_out, ff_norm, gate (activated), up (linear), down)."""
        raise NotImplementedError

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor | None,
                kv: KVCache | None, layer: int, rows: tuple[int, int]) -> Tensor:
        attn_norm, q, k, v, attn_out, ff_norm, gate, up, down = self.parts()
        a = attn_norm(h)
        o = attend(q(a), k(a), v(a), n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, cos=cos,
                   sin=sin, key_mask=key_mask, kv=kv, layer=layer, rows=rows,
                   rope_full_precision=self.rope_full_precision)
        h = h + attn_out(o)
        f = ff_norm(h)
        return h + down(F.silu(gate(f)) * up(f))


class BlockStackLM(nn.Module):
    """Skeleton shared by LLaDA and Dream: embedding, a stack of `PreNormBlock`s, the KV cache.

    Subclasses set `self.config` (with `head_dim`, `rope_theta` and `to_dict()` in the released
    layout) and return their embedding and blocks from `parts()`; their `forward` adds the final
    norm and the head.
    """

    supports_kv = True
    trimmable = True           # logits depend only on attended columns; positions count from the left
    config: Any

    def parts(self) -> tuple[nn.Embedding, nn.ModuleList]:
        raise NotImplementedError

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor | None,
                      positions: Tensor | None, kv: KVCache | None, rows: tuple[int, int] | None,
                      lookback: int = 0) -> tuple[Tensor, Tensor, tuple[int, int, int]]:
        """Run the blocks over what canvas rows `rows = (a, b)` need (see `DiffusionLM`).

        A filled cache supplies every other column, so only `[a - lookback, b)` is computed;
        otherwise every row is (and, with an empty cache, stored).
        Returns:
            (B, b - lo, d) hidden states of rows `[lo, b)` after the last block, with
            `lo = max(a - lookback, 0)`; the (B, L) positions used; and `(lo, a, b)`.
        """
        batch, length = input_ids.shape
        a, b = rows if rows is not None else (0, length)
        lo = max(a - lookback, 0)
        if positions is None:
            positions = default_positions(attention_mask, batch, length, input_ids.device)
        fed = (lo, b) if kv is not None and kv.filled else (0, length)   # compute only what's needed
        cos, sin = rope_tables(positions[:, fed[0]:fed[1]], self.config.head_dim,
                               self.config.rope_theta)
        key_mask = key_mask_of(attention_mask)
        embed, blocks = self.parts()
        h = embed(input_ids[:, fed[0]:fed[1]])
        for layer, block in enumerate(blocks):
            h = block(h, cos, sin, key_mask, kv, layer, fed)
        return h[:, lo - fed[0]:b - fed[0]], positions, (lo, a, b)

    def save_pretrained(self, directory: str | Path, dtype: torch.dtype = torch.float32) -> None:
        """Write `config.json` and `model.safetensors` in the released on-disk layout."""
        from dllm_decode.models.checkpoint import save_checkpoint

        save_checkpoint(directory, self.config.to_dict(), self, dtype)
