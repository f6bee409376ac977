"""Pieces shared by the plain-torch LLaDA and Dream implementations: RMSNorm, RoPE, attention
against a block-level KV cache, default positions, the pre-norm block and the block stack.

The KV cache holds each layer's keys (already rotated) and values for the whole canvas. A forward
over canvas rows `[a, b)` writes its fresh K/V into those columns in place and attends over every
column: that single operation is both Fast-dLLM's dual cache (rows = the block) and its prefix
cache (rows = the block and the whole suffix).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


class RMSNorm(nn.Module):
    """Llama ordering: normalise in float32, cast back to the input dtype, then scale."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


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


def rows_to_compute(kv: KVCache | None, rows: tuple[int, int], length: int,
                    lookback: int = 0) -> tuple[int, int]:
    """Canvas rows `[a, b)` a forward must run: all of them unless a filled cache holds the rest.

    `lookback` extra rows before `rows` are computed too (Dream reads the logit of row a - 1).
    """
    if kv is None or not kv.filled:
        return 0, length
    return max(rows[0] - lookback, 0), rows[1]


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


def run_blocks(embed: nn.Embedding, blocks: nn.ModuleList, input_ids: Tensor,
               attention_mask: Tensor | None, positions: Tensor, kv: KVCache | None,
               fed: tuple[int, int], head_dim: int, rope_theta: float) -> Tensor:
    """Embed canvas rows `fed = [a, b)` and run every block on them, through the cache if given.

    Args:
        input_ids: (B, L) the whole canvas; positions: (B, L).
        attention_mask: (B, L) 0/1 over all columns (padded keys are never attended) or None.
    Returns:
        (B, b - a, d) hidden states after the last block (before the final norm).
    """
    cos, sin = rope_tables(positions[:, fed[0]:fed[1]], head_dim, rope_theta)
    key_mask = key_mask_of(attention_mask)
    h = embed(input_ids[:, fed[0]:fed[1]])
    for layer, block in enumerate(blocks):
        h = block(h, cos, sin, key_mask, kv, layer, fed)
    return h
