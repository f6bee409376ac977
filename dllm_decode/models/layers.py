"""Pieces shared by the plain-torch models (LLaDA, Dream, the block-diffusion families): RMSNorm,
RoPE (full or partial), attention against a block-level KV cache, default positions, the
block-causal mask, the SwiGLU MLP, the pre-norm block and the model skeleton.

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

from dllm_decode.quant.kv import is_packed, pack, unpack


class FloatStore:
    """How a `KVCache` keeps each layer's K/V by default: plain tensors in the dtype written. A
    low-precision store (`dllm_decode.quant.kv.KVQuantStore`) has the same methods."""

    @staticmethod
    def put(x: Tensor) -> Tensor:
        return x.contiguous()

    @staticmethod
    def read(t: Tensor) -> Tensor:
        return t

    @staticmethod
    def write(t: Tensor, rows: tuple[int, int], x: Tensor, keep: Tensor | None = None) -> None:
        """Columns `rows` of `t` become `x`, except where `keep` (B, 1, n, 1) is True."""
        t[:, :, rows[0]:rows[1]] = x if keep is None else torch.where(keep, t[:, :, rows[0]:rows[1]], x)

    @staticmethod
    def select(t: Tensor, rows: Tensor) -> Tensor:
        return t.index_select(0, rows)

    @staticmethod
    def pad(t: Tensor, width: int) -> Tensor:
        return torch.cat([t, t.new_zeros(*t.shape[:2], width - t.shape[2], t.shape[3])], 2)

    @staticmethod
    def trim(t: Tensor, width: int) -> Tensor:
        return t[:, :, :width]


FLOAT_STORE = FloatStore()


@dataclass
class KVCache:
    """Per-layer keys (rotated) and values, each (B, Hkv, L, D). Empty until a full forward fills it.

    `store` says how each layer is kept: plain tensors (`FLOAT_STORE`), or low-precision codes
    with scales (`dllm_decode.quant.kv`); `for_model` takes the model's own (`model.kv_store`).
    """

    keys: list[Any] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    store: Any = FLOAT_STORE
    keep: Tensor | None = None
    """(B, L) bool or None: columns whose stored K/V a forward through the filled cache leaves as
    they are, row by row (a row's columns outside its own window, `dllm_decode.row_windows`)."""

    @classmethod
    def for_model(cls, model: Any) -> "KVCache":
        """An empty cache that keeps K/V as `model` asks (`kv_cache_dtype`; float by default)."""
        return cls(store=getattr(model, "kv_store", None) or FLOAT_STORE)

    @property
    def filled(self) -> bool:
        return bool(self.keys)

    def clear(self) -> None:
        self.keys.clear()
        self.values.clear()

    def update(self, layer: int, k: Tensor, v: Tensor, rows: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """Store or write one layer's fresh (B, Hkv, Lq, D) K/V; returns the K/V to attend over.

        Empty layer (a refresh: the forward fed every row): store them (contiguous, so a view
        never keeps its whole fused projection alive). Filled: write canvas columns `rows` in
        place, except the columns `keep` marks. Either way the layer's whole K/V as the store
        reads them back (the float store: the tensors themselves; a low-precision one:
        dequantized, as the captured step reads).
        """
        store = self.store
        if len(self.keys) <= layer:
            self.keys.append(store.put(k))
            self.values.append(store.put(v))
        else:
            keep = None if self.keep is None else self.keep[:, None, rows[0]:rows[1], None]
            store.write(self.keys[layer], rows, k, keep)
            store.write(self.values[layer], rows, v, keep)
        return store.read(self.keys[layer]), store.read(self.values[layer])

    def select_rows(self, rows: Tensor) -> "KVCache":
        return KVCache([self.store.select(k, rows) for k in self.keys],
                       [self.store.select(v, rows) for v in self.values], self.store)

    def pad_to(self, width: int) -> "KVCache":
        """Zero columns up to `width` (in place): room for rows a later forward writes before it
        attends them (block-causal models never attend a column before writing it)."""
        for kept in (self.keys, self.values):
            for i, t in enumerate(kept):
                if t.shape[2] < width:
                    kept[i] = self.store.pad(t, width)
        return self

    def trim(self, width: int) -> "KVCache":
        """Keep the first `width` canvas columns (the loop cut the dead tail off the canvas)."""
        return KVCache([self.store.trim(k, width) for k in self.keys],
                       [self.store.trim(v, width) for v in self.values], self.store)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored K/V (codes and scales for a low-precision store)."""
        return sum(t.nbytes for kept in (self.keys, self.values) for t in kept)

    all_queries = False
    """Whether a forward through this state needs every fed row's query in every layer."""

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               query_start: int = 0) -> Tensor:
        """Layer `layer`'s attention (the seam an attention back end's per-request state, such
        as `models.sparsed.SparseState`, replaces): SDPA under `mask`."""
        return sdpa(q, k, v, mask)


@dataclass
class StaticKVCache:
    """The `KVCache` contract on preallocated storage, for a captured step: keys and values of
    every layer in one (layers, B, Hkv, L + 1, D) tensor each, allocated once per bucket and
    written in place, so their addresses never change (a CUDA graph replays fixed addresses).

    Column L is a scratch column: padded window entries point at it, so their K/V land there and
    are never attended (the step's key mask is 0 there). `update` takes the fed canvas columns as
    a (W,) device index instead of an integer range, so the window's place is data, not a Python
    int that would specialise a compiled graph. A refresh is the same call with every column fed.

    A low-precision store (`dllm_decode.quant.kv`) keeps (layers, B, Hkv, L + 1, D + 4) bytes:
    each head's codes, then its float32 scale; a read dequantizes to the fresh K/V's dtype.
    """

    keys: Tensor
    values: Tensor

    filled = True

    @classmethod
    def allocate(cls, shape: tuple[int, ...], dtype: torch.dtype, device: Any,
                 store: Any = None) -> "StaticKVCache":
        """Zeroed storage for K/V of `shape` (layers, B, Hkv, L + 1, D) and `dtype`, kept as
        `store` packs them (None: float)."""
        if store is not None:
            width, dtype = store.static_layout(shape[-1])
            shape = (*shape[:-1], width)
        return cls(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device))

    def update(self, layer: int, k: Tensor, v: Tensor, rows: Tensor,
               keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Write one layer's fresh (B, Hkv, W, D) K/V at canvas columns `rows` (W,) and return the
        layer's whole (B, Hkv, L + 1, D) K/V to attend over. `keep` (B, W) bool: the window
        columns whose stored K/V stay, row by row (as `KVCache.keep`)."""
        keys, values = self.keys[layer], self.values[layer]
        dtype, packed = k.dtype, is_packed(keys)    # a dtype: fixed when a compiled step is traced
        k, v = (pack(k, keys.dtype), pack(v, values.dtype)) if packed else (k.to(keys.dtype), v.to(values.dtype))
        if keep is not None:
            kept = keep[:, None, :, None]
            k = torch.where(kept, keys.index_select(2, rows), k)
            v = torch.where(kept, values.index_select(2, rows), v)
        keys.index_copy_(2, rows, k)
        values.index_copy_(2, rows, v)
        if packed:
            return unpack(keys, dtype), unpack(values, dtype)
        return keys, values


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
    """Rotate (B, H, Lq, D) `x`. LLaDA rotates in float32; Dream in the model dtype.

    Tables narrower than D (partial rotary, e.g. LLaDA2's factor 0.5) rotate the first
    `cos.shape[-1]` dims of each head and pass the rest through.
    """
    if cos.shape[-1] < x.shape[-1]:
        width = cos.shape[-1]
        return torch.cat([apply_rope(x[..., :width], cos, sin, full_precision), x[..., width:]], -1)
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
           rows: tuple[int, int], rope_full_precision: bool, q_norm: nn.Module | None = None,
           k_norm: nn.Module | None = None) -> Tensor:
    """Attention of the fed rows over every key the mask allows, optionally through the KV cache.

    Args:
        q, k, v: (B, Lq, H*D), (B, Lq, Hkv*D), (B, Lq, Hkv*D) projections of the fed rows.
        cos, sin: rotary tables for the fed rows.
        key_mask: bool (True = attend) or None: (B, 1, 1, L) over all keys (bidirectional), or
            (B, 1, Lq, L) per fed row (block-causal models).
        kv: the cache; empty -> store this layer's K/V; filled -> write rows in place, attend all;
            its `attend` runs the attention (SDPA, or an attention back end's).
        rows: canvas columns `[a, b)` of the fed rows.
        q_norm, k_norm: per-head norms over D applied before the rotation (Qwen3/SDAR, LLaDA2).
    Returns:
        (B, Lq, H*D) attention output.
    """
    q = rearrange(q, "b l (h d) -> b h l d", h=n_heads)
    k = rearrange(k, "b l (h d) -> b h l d", h=n_kv_heads)
    v = rearrange(v, "b l (h d) -> b h l d", h=n_kv_heads)
    if q_norm is not None:
        q, k = q_norm(q), k_norm(k)
    q = apply_rope(q, cos, sin, rope_full_precision)
    k = apply_rope(k, cos, sin, rope_full_precision)
    if kv is not None:
        k, v = kv.update(layer, k, v, rows)
    out = sdpa(q, k, v, key_mask) if kv is None else kv.attend(layer, q, k, v, key_mask)
    return rearrange(out, "b h l d -> b l (h d)")


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, expand_kv: bool | None = None) -> Tensor:
    """`F.scaled_dot_product_attention` for (B, H, Lq, D) queries over (B, Hkv, L, D) keys, the
    one attention call of every runtime (reference, compact, captured).

    With grouped-query heads (Hkv < H) and a mask, CUDA has no fused kernel for `enable_gqa`
    (flash attention takes no mask, the memory-efficient kernel no GQA), so SDPA falls back to
    the math kernel, which materialises the (Lq, L) scores per head. There the K/V heads are
    repeated instead (`expand_kv`, default: a masked GQA call on CUDA), which the
    memory-efficient kernel runs; on the CPU `enable_gqa` is kept (no copy, same kernel).
    """
    groups = q.shape[1] // k.shape[1]
    if expand_kv is None:
        expand_kv = groups > 1 and mask is not None and q.is_cuda
    if expand_kv and groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


def key_mask_of(attention_mask: Tensor | None) -> Tensor | None:
    """(B, L) 0/1 mask -> (B, 1, 1, L) bool for SDPA; padded keys are never attended."""
    return None if attention_mask is None else attention_mask.bool()[:, None, None, :]


def block_causal_mask(positions: Tensor, fed: tuple[int, int], block_size: int,
                      attention_mask: Tensor | None) -> Tensor:
    """(B, 1, Lq, L) bool: fed query q may attend key k iff block(k) <= block(q), k not padding.

    Blocks come from POSITIONS (block = position // block_size, the grid anchored at each row's
    first real token), never from canvas columns, so a left-padded row keeps the grid it has
    alone. Bidirectional inside a block, causal across blocks (Arriola et al., 2025, arXiv
    2503.09573; Fast-dLLM v2 arXiv 2509.26328; SDAR arXiv 2510.06303).
    """
    blocks = torch.div(positions, block_size, rounding_mode="floor")          # (B, L)
    allowed = blocks[:, None, :] <= blocks[:, fed[0]:fed[1], None]            # (B, Lq, L)
    if attention_mask is not None:
        allowed = allowed & attention_mask.bool()[:, None, :]
    return allowed[:, None]


class BlockCausal:
    """Mixin for block-diffusion models: attention is block-causal over `block_size` positions.

    Contract (besides `DiffusionLM`): `block_size` is the model's block b (the decoding block);
    query q attends key k iff `k // b <= q // b` in positions, and never padding. Because no row
    attends a later block, the K/V of block j depend on blocks 0..j only: a `KVCache` whose
    columns before the active block were written while those blocks held their final tokens is
    EXACT (no later block can change them). `token_shift` says which logits row the
    network itself uses for position i (1: row i - 1, Fast-dLLM v2; 0: row i); the adapters
    undo it, so the returned row i always predicts position i.
    """

    block_size: int
    token_shift: int = 0

    @property
    def block_start_first(self) -> bool:
        """True for a token-shifted model: a block's first position is predicted by the previous
        block's last row, which never sees the block, so its logit is final before the block's
        first step; the loop then commits that position alone in that step, as the reference
        decoders do (`models.block_grid.block_start_columns`)."""
        return self.token_shift > 0

    def key_mask(self, attention_mask: Tensor | None, positions: Tensor,
                 fed: tuple[int, int]) -> Tensor:
        return block_causal_mask(positions, fed, self.block_size, attention_mask)


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))` under the Llama/Qwen names `gate_proj`, `up_proj`, `down_proj`."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)     # activated
        self.up_proj = nn.Linear(dim, hidden, bias=False)       # linear
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TiedHead(nn.Module):
    """The head of a checkpoint with tied embeddings: `h @ embedding.weight.T`, called as a module
    like an untied head (so a parallel plan can replace either). Holds no parameter of its own:
    the state dict keeps the checkpoint's names."""

    def __init__(self, embedding: nn.Module):
        super().__init__()
        self._embedding = [embedding]             # a list: not a submodule, no second state key

    def forward(self, h: Tensor) -> Tensor:
        return F.linear(h, self._embedding[0].weight)


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

    def qk_norms(self) -> tuple[nn.Module | None, nn.Module | None]:
        """Per-head query and key norms (none by default)."""
        return None, None

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor | None,
                kv: KVCache | None, layer: int, rows: tuple[int, int]) -> Tensor:
        attn_norm, q, k, v, attn_out, ff_norm, gate, up, down = self.parts()
        q_norm, k_norm = self.qk_norms()
        a = attn_norm(h)
        o = attend(q(a), k(a), v(a), n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, cos=cos,
                   sin=sin, key_mask=key_mask, kv=kv, layer=layer, rows=rows,
                   rope_full_precision=self.rope_full_precision, q_norm=q_norm, k_norm=k_norm)
        h = h + attn_out(o)
        f = ff_norm(h)
        return h + down(F.silu(gate(f)) * up(f))


RUNTIME_STATE = "_compact"
"""The `__dict__` key under which the compact runtime keeps a model's fused stack."""
COMPACT_MODULES = "_compact_modules"
"""The `__dict__` key of the compact runtime's list of the model's modules (kept between forwards)."""


class BlockStackLM(nn.Module):
    """Skeleton shared by the plain-torch models: embedding, a stack of blocks, the KV cache.

    Subclasses set `self.config` (with `head_dim`, `rope_theta` and `to_dict()` in the released
    layout) and return their embedding and blocks from `parts()`; their `forward` adds the final
    norm and the head.
    """

    supports_kv = True
    trimmable = True           # logits depend only on attended columns; positions count from the left
    runtime = "reference"      # or "compact": set both with `models.compact.set_runtime`
    block_runner: Any = None   # the compact runtime's `compact_stack`; training always runs reference
    config: Any

    def parts(self) -> tuple[nn.Embedding, nn.ModuleList]:
        raise NotImplementedError

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        # .to() / .half() / .cuda(): let the old weights go now, not at the next forward
        self.__dict__.pop(RUNTIME_STATE, None)
        return super()._apply(fn, *args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        # copies and pickles rebuild the compact stack on their own weights
        state = dict(super().__getstate__())
        state.pop(RUNTIME_STATE, None)
        state.pop(COMPACT_MODULES, None)
        return state

    def rotary_dim(self) -> int:
        """Width of the rotary tables (the head dim; less under partial rotary)."""
        return self.config.head_dim

    def key_mask(self, attention_mask: Tensor | None, positions: Tensor,
                 fed: tuple[int, int]) -> Tensor | None:
        """Which keys each fed row attends: every real key (bidirectional models)."""
        return key_mask_of(attention_mask)

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor | None,
                      positions: Tensor | None, kv: KVCache | None, rows: tuple[int, int] | None,
                      lookback: int = 0, key_mask: Tensor | None = None,
                      ) -> tuple[Tensor, Tensor, tuple[int, int, int]]:
        """Run the blocks over what canvas rows `rows = (a, b)` need (see `DiffusionLM`).

        A filled cache supplies every other column, so only `[a - lookback, b)` is computed;
        otherwise every row is (and, with an empty cache, stored). `key_mask` (B, 1, Lq, L) bool
        replaces the family's attention pattern (a verification forward under its own mask).
        Returns:
            (B, b - lo, d) hidden states of rows `[lo, b)` after the last block, with
            `lo = max(a - lookback, 0)`; the (B, L) positions used; and `(lo, a, b)`. The
            hidden state of a left-padding column is zero (what the blocks compute there depends
            on the runtime; nothing reads it).
        """
        batch, length = input_ids.shape
        a, b = rows if rows is not None else (0, length)
        lo = max(a - lookback, 0)
        defaulted = positions is None
        if defaulted:
            positions = default_positions(attention_mask, batch, length, input_ids.device)
        fed = (lo, b) if kv is not None and kv.filled else (0, length)   # compute only what's needed
        if key_mask is None:
            key_mask = self.key_mask(attention_mask, positions, fed)
        embed, blocks = self.parts()
        h = embed(input_ids[:, fed[0]:fed[1]])
        fed_positions = positions[:, fed[0]:fed[1]]
        keep = (lo - fed[0], b - fed[0])                  # the fed rows whose output is read
        # the fed columns that are not left padding: the output at padding is zero in every runtime
        present = None if attention_mask is None else attention_mask[:, fed[0]:fed[1]].cumsum(-1) > 0
        if self.block_runner is not None and not torch.is_grad_enabled():
            # Default positions never exceed the canvas width: no host sync for the table size.
            bound = length - 1 if defaulted else None
            h = self.block_runner(self)(h, fed_positions, key_mask, kv, fed, bound, keep, present)
        else:
            cos, sin = rope_tables(fed_positions, self.rotary_dim(), self.config.rope_theta)
            for layer, block in enumerate(blocks):
                h = block(h, cos, sin, key_mask, kv, layer, fed)
            h = h[:, keep[0]:keep[1]]
        if present is not None:
            h = h.masked_fill(~present[:, keep[0]:keep[1], None], 0)
        return h, positions, (lo, a, b)

    def save_pretrained(self, directory: str | Path, dtype: torch.dtype = torch.float32) -> None:
        """Write `config.json` and `model.safetensors` in the released on-disk layout."""
        from dllm_decode.models.checkpoint import save_checkpoint

        save_checkpoint(directory, self.config.to_dict(), self, dtype)
