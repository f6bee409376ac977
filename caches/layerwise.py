"""A layer-by-layer forward over the plain-torch bidirectional models, for the caches that choose,
per step and per layer, which canvas columns to recompute and that read attention probabilities
(d2Cache, Elastic-Cache): it forwards a subset of query rows per layer against the full cached
K/V, reads attention probabilities, and can switch to a full recompute from any layer on.

It reads the model's internals (`BlockStackLM.parts()`, each block's `parts()`), so it serves the
LLaDA layout (the embedded model) and unshifted `DecoderLM`s; Dream (token shift) and the
block-causal families get a one-line error. Attention is written out (scores, softmax, weighted
sum) to expose the probabilities, in float32, like the references' `attn_implementation=eager`;
its logits equal the fused SDPA forward's to float rounding (tested against `none`).

Under tensor parallelism each rank holds only its heads' probabilities; every statistic a cache
takes over heads goes through `Stack.head_mean` / `Stack.head_sum` (the local sum, then one
all_reduce over the tensor-parallel group), so every rank decides on the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from dllm_decode.compat import accepted_hint
from dllm_decode.models.layers import BlockStackLM, apply_rope, default_positions, rope_tables
from dllm_decode.parallel.collectives import all_reduce
from dllm_decode.errors import model_name


def check_model(model, cache_name: str) -> None:
    """Raise a one-line ValueError unless `model` is a bidirectional plain-torch stack."""
    name = model_name(model)
    if not getattr(model, "supports_kv", False):
        raise ValueError(f"cache {cache_name} needs a model with a KV cache, and {name} has none "
                         f"(supports_kv is False){accepted_hint(model)}")
    if (not isinstance(model, BlockStackLM) or getattr(model, "token_shift", 0)
            or getattr(model, "block_size", None)):
        raise ValueError(f"cache {cache_name} runs the layers itself and supports the LLaDA layout "
                         f"(bidirectional, unshifted); {name} is not one{accepted_hint(model)}")


@dataclass
class LayerState:
    """Per layer: the input hidden states (B, L, d), the rotated keys and the values (B, Hkv, L, D)."""

    inputs: list[Tensor]
    keys: list[Tensor]
    values: list[Tensor]

    def select_rows(self, rows: Tensor) -> LayerState:
        pick = lambda ts: [t.index_select(0, rows) for t in ts]   # noqa: E731
        return LayerState(pick(self.inputs), pick(self.keys), pick(self.values))

    def trim(self, width: int) -> LayerState:
        return LayerState([t[:, :width] for t in self.inputs], [t[:, :, :width] for t in self.keys],
                          [t[:, :, :width] for t in self.values])


def key_mask(attention_mask: Tensor | None, batch: int, length: int, device: torch.device,
             cut: int | None = None) -> Tensor:
    """(B, 1, 1, L) bool keys every query may attend: real tokens; with `cut`, only the columns
    before it and the last canvas column (suffix pruning keeps the tail, as Streaming-dLLM)."""
    keep = torch.ones(batch, length, dtype=torch.bool, device=device) if attention_mask is None \
        else attention_mask.bool()
    if cut is not None and cut < length - 1:
        columns = torch.arange(length, device=device)
        keep = keep & ((columns < cut) | (columns == length - 1))
    return keep[:, None, None, :]


class Stack:
    """The model seen one layer at a time: embed, rotary tables, attention with probabilities, the
    rest of a block, and the head."""

    def __init__(self, model: BlockStackLM):
        self.model = model
        self.embed, self.blocks = model.parts()
        groups = getattr(model, "tensor_parallel", None)
        tp = 1 if groups is None else groups.tp
        self.group_name, self.tp = (None, 1) if tp == 1 else (groups.tp_group_name, tp)

    def head_mean(self, p: Tensor) -> Tensor:
        """(B, H, ...) -> (B, ...) mean over every head of the model: `p.mean(1)` in one process;
        under tensor parallelism the local heads' sum, all-reduced, over the global head count
        (one all_reduce)."""
        if self.group_name is None:
            return p.mean(1)
        return all_reduce(p.sum(1), self.group_name) / (p.shape[1] * self.tp)

    def head_sum(self, x: Tensor) -> Tensor:
        """`x` summed over the tensor-parallel group (one all_reduce); `x` in one process."""
        return all_reduce(x, self.group_name)

    @property
    def depth(self) -> int:
        return len(self.blocks)

    def positions(self, canvas: Tensor, attention_mask: Tensor | None) -> Tensor:
        return default_positions(attention_mask, canvas.shape[0], canvas.shape[1], canvas.device)

    def inputs(self, canvas: Tensor, attention_mask: Tensor | None, block_end: int,
               suffix_window: int | None) -> tuple[Tensor, Tensor, Tensor]:
        """(positions, key mask, masked columns) of a step: what every adaptive cache starts from;
        `suffix_window` keeps only that many columns after the block (plus the last one)."""
        cut = None if suffix_window is None else block_end + suffix_window
        mask = key_mask(attention_mask, canvas.shape[0], canvas.shape[1], canvas.device, cut)
        return self.positions(canvas, attention_mask), mask, canvas == self.model.mask_token_id

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return rope_tables(positions, self.model.rotary_dim(), self.model.config.rope_theta)

    def project(self, layer: int, h: Tensor, rope: tuple[Tensor, Tensor],
                need_kv: bool = True) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(B, H, n, D) rotated queries and (B, Hkv, n, D) rotated keys and values of rows `h`."""
        block = self.blocks[layer]
        attn_norm, q_proj, k_proj, v_proj, *_ = block.parts()
        q_norm, k_norm = block.qk_norms()
        a = attn_norm(h)
        q = rearrange(q_proj(a), "b l (h d) -> b h l d", h=block.n_heads)
        if q_norm is not None:
            q = q_norm(q)
        q = apply_rope(q, *rope, block.rope_full_precision)
        if not need_kv:
            return q, None, None
        k = rearrange(k_proj(a), "b l (h d) -> b h l d", h=block.n_kv_heads)
        v = rearrange(v_proj(a), "b l (h d) -> b h l d", h=block.n_kv_heads)
        if k_norm is not None:
            k = k_norm(k)
        return q, apply_rope(k, *rope, block.rope_full_precision), v

    def probs(self, layer: int, q: Tensor, keys: Tensor, mask: Tensor) -> Tensor:
        """(B, H, n, L) float32 attention probabilities of queries `q` over every key `mask` allows."""
        block = self.blocks[layer]
        if block.n_heads != block.n_kv_heads:
            keys = keys.repeat_interleave(block.n_heads // block.n_kv_heads, 1)
        scores = q.float() @ keys.float().transpose(-1, -2) * q.shape[-1] ** -0.5
        return scores.masked_fill(~mask, float("-inf")).softmax(-1)

    def finish(self, layer: int, h: Tensor, probs: Tensor, values: Tensor) -> Tensor:
        """The rest of the block: output projection, residual, the gated FFN."""
        h = h + self.attend(layer, probs, values, h.dtype)
        return h + self.ffn(layer, h)

    def attend(self, layer: int, probs: Tensor, values: Tensor, dtype: torch.dtype) -> Tensor:
        """(B, n, d) the attention's output projection of `probs` (B, H, n, L) over `values`."""
        block = self.blocks[layer]
        attn_out = block.parts()[4]
        if block.n_heads != block.n_kv_heads:
            values = values.repeat_interleave(block.n_heads // block.n_kv_heads, 1)
        return attn_out(rearrange((probs @ values.float()).to(dtype), "b h l d -> b l (h d)"))

    def ffn(self, layer: int, h: Tensor) -> Tensor:
        """(B, n, d) the gated FFN's output for residual rows `h` (its norm included)."""
        *_, ff_norm, gate, up, down = self.blocks[layer].parts()
        f = ff_norm(h)
        return down(F.silu(gate(f)) * up(f))

    def values(self, layer: int, h: Tensor) -> Tensor:
        """(B, Hkv, n, D) the value vectors of residual rows `h` alone (no query or key)."""
        block = self.blocks[layer]
        attn_norm, _, _, v_proj, *_ = block.parts()
        return rearrange(v_proj(attn_norm(h)), "b l (h d) -> b h l d", h=block.n_kv_heads)

    def head(self, h: Tensor) -> Tensor:
        """Last-layer hidden states (B, n, d) -> float32 logits (B, n, V)."""
        model = self.model
        if hasattr(model.model, "transformer"):                          # LLaDA layout
            return model.head(model.model.transformer["ln_f"](h))
        return model.head(model.model.norm(h))                           # DecoderLM, unshifted

    def full(self, canvas: Tensor, positions: Tensor, mask: Tensor,
             on_layer=None) -> tuple[Tensor, LayerState]:
        """Every column through every layer; fills a new `LayerState`. `on_layer(layer, probs)`
        sees each layer's (B, H, L, L) probabilities. Returns the last hidden states (B, L, d)."""
        rope = self.rope(positions)
        h = self.embed(canvas)
        state = LayerState([], [], [])
        for layer in range(self.depth):
            state.inputs.append(h)
            q, k, v = self.project(layer, h, rope)
            state.keys.append(k)
            state.values.append(v)
            p = self.probs(layer, q, k, mask)
            if on_layer is not None:
                on_layer(layer, p)
            h = self.finish(layer, h, p, v)
        return h, state

    def rows(self, state: LayerState, canvas: Tensor, positions: Tensor, mask: Tensor,
             index: Tensor, on_layer=None) -> Tensor:
        """Columns `index` (B, n) through every layer against the cached K/V of the others; their
        fresh inputs, keys and values are written into `state` in place (duplicate columns compute
        equal values). `on_layer(layer, probs)` sees (B, H, n, L). Returns (B, n, d)."""
        rope = self.rope(positions.gather(1, index))
        h = self.embed(canvas.gather(1, index))
        for layer in range(self.depth):
            state.inputs[layer].scatter_(1, index[..., None].expand_as(h), h)
            q, k, v = self.project(layer, h, rope)
            at = index[:, None, :, None].expand_as(k)
            state.keys[layer].scatter_(2, at, k)
            state.values[layer].scatter_(2, at, v)
            p = self.probs(layer, q, state.keys[layer], mask)
            if on_layer is not None:
                on_layer(layer, p)
            h = self.finish(layer, h, p, state.values[layer])
        return h


def confidence(logits: Tensor, mask_id: int) -> Tensor:
    """(B, n) float32 top probability with [MASK] excluded (the loop's greedy confidence)."""
    logits = logits.float().index_fill(-1, torch.tensor([mask_id], device=logits.device),
                                       torch.finfo(torch.float32).min)
    return logits.softmax(-1).amax(-1)
