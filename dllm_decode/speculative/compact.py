"""A Llama-family transformers causal LM re-run as a lean plain-torch decoder (`--runtime compact`).

At the embedded models' size (1.8M and 0.25M parameters) a transformers forward costs about a
millisecond per decoder layer in Python dispatch (cache objects, mask building, hooks), not in
arithmetic: the 2-layer draft then costs 0.4 of the 4-layer target although it does 1/7 of the
FLOPs, and speculative decoding cannot pay off. This module runs the same weights with only the
tensor operations: fused QKV and gate/up projections, a preallocated KV cache that is cut back by
moving its length, rotary tables computed once. Logits match the transformers model to float
rounding (tested); it plugs into `kv.extend`/`kv.feed` like a transformers model.

Supported: `model_type` `llama` (Llama, SmolLM2, the embedded AR pair) with SiLU MLPs and
default-style rotary embeddings (the model's own `inv_freq` and scaling are used); anything else
is refused with a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode.models.layers import rms_normalize

STATIC_ROPE = ("default", "linear", "llama3", "yarn")
"""Rotary types whose frequencies do not depend on the sequence length (computed once here)."""

RUNTIMES = ("hf", "compact")
"""`hf`: run the transformers model as loaded; `compact`: `CompactCausalLM(model)`."""


class CompactCache:
    """Per-layer keys (rotated) and values in preallocated (B, Hkv, capacity, D) buffers.

    Follows the two transformers-cache methods the AR loop uses: `get_seq_length` and `crop`
    (a negative argument drops that many positions, a non-negative one keeps that many), plus
    `gather` for token trees.
    """

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, capacity: int = 256):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        shape = (batch, kv_heads, capacity, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0

    def get_seq_length(self, layer: int = 0) -> int:
        return self.length

    def crop(self, size: int) -> None:
        self.length = max(0, self.length + size) if size < 0 else min(self.length, size)

    def gather(self, start: int, rows: Tensor) -> None:
        """Copy positions `rows` to `start`, `start + 1`, ... in every layer (token-tree
        compaction; the caller then cuts the length)."""
        end = start + rows.shape[0]
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[:, :, start:end] = buffer[:, :, rows]          # the index copies first

    def reserve(self, total: int) -> None:
        """Grow every buffer (doubling) so that `total` positions fit."""
        capacity = self.keys[0].shape[2]
        if total <= capacity:
            return
        while capacity < total:
            capacity *= 2
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = old.new_empty(old.shape[:2] + (capacity,) + old.shape[3:])
                new[:, :, :self.length] = old[:, :, :self.length]
                buffers[i] = new


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's weights, projections fused (q|k|v, gate|up) and stored transposed
    ((in, out), contiguous): `x @ w` on such tiny matrices takes about half the time of
    `F.linear(x, w)` on CPU (measured). Each RMSNorm's scale is folded into the rows of the
    matrix that follows it ((x * g) @ W = x @ (g[:, None] * W)), one multiply fewer per norm."""

    qkv: Tensor
    qkv_bias: Tensor | None
    out: Tensor
    out_bias: Tensor | None
    gate_up: Tensor
    down: Tensor


@dataclass(frozen=True)
class CompactOutput:
    logits: Tensor


class CompactCausalLM:
    """Lean decoder over a transformers Llama's weights; call it like the transformers model.

    Holds its own fused, transposed copies of the matrices (the input embedding is shared; the
    LM head is a separate scaled copy even when tied), so it needs about the model's size again
    in memory; the source model can be dropped afterwards.

    Attributes:
        config: the transformers config (vocab size, EOS ids, ...), shared with the source model.
        tokenizer: the source model's `.tokenizer` (None if it had none).
        device: where the weights live.
    """

    def __init__(self, source: Any, layers: Sequence[int] | None = None):
        config = source.config
        check_compactable(source)
        inner = source.model
        kept = range(len(inner.layers)) if layers is None else layers
        self.config = config
        self.tokenizer = getattr(source, "tokenizer", None)
        self.name_or_path = getattr(source, "name_or_path", None)
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.embed = inner.embed_tokens.weight.detach()
        self.head = _transposed(source.lm_head.weight, inner.norm.weight)
        self.device = self.embed.device
        self.layers = [_fuse(inner.layers[i]) for i in kept]
        rotary = inner.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().float()
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self._cos = self._sin = torch.empty(0)

    def new_cache(self, batch: int = 1) -> CompactCache:
        return CompactCache(len(self.layers), batch, self.kv_heads, self.head_dim,
                            self.embed.dtype, self.embed.device)

    def __call__(self, *args: Any, **kwargs: Any) -> CompactOutput:
        return self.forward(*args, **kwargs)   # looked up per call, so benchmarks can time it

    def forward(self, input_ids: Tensor, past_key_values: CompactCache | None = None,
                use_cache: bool = True, logits_to_keep: int = 0,
                attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                **_: Any) -> CompactOutput:
        """Next-token logits of `input_ids` (B, n) appended after the cached positions.

        `logits_to_keep` = 0 keeps every position (transformers' convention). The cache, when
        given, then holds the fed tokens too. No autograd: every weight is detached. No padding:
        a 2-D `attention_mask` with zeros is refused (rows must be unpadded and equally long). A
        4-D bool `attention_mask` (B or 1, 1, n, cached + n) is a custom mask (True = attend) and
        `position_ids` (B or 1, n) custom positions, as transformers takes them: token trees.
        """
        custom = attention_mask is not None and attention_mask.dim() == 4
        if custom and attention_mask.dtype != torch.bool:
            raise ValueError("the compact runtime takes a 4-D attention_mask as bool (True = attend)")
        if attention_mask is not None and not custom and not bool(attention_mask.all()):
            raise ValueError("the compact runtime does not support padding (attention_mask with "
                             "zeros); use the 'hf' runtime for padded batches")
        if past_key_values is not None and not isinstance(past_key_values, CompactCache):
            raise TypeError(f"past_key_values must be a CompactCache (from `new_cache()`), got "
                            f"{type(past_key_values).__name__}")
        cache = past_key_values if past_key_values is not None else self.new_cache(input_ids.shape[0])
        start, n = cache.length, input_ids.shape[1]
        total = start + n
        cache.reserve(total)
        if position_ids is None:
            cos, sin = self._rope(start, total)
        else:
            cos, sin = self._rope_at(position_ids[0])
        # Causal mask for several fed tokens; a single token attends to everything cached.
        mask = attention_mask if custom else None
        if n > 1 and not custom:
            mask = torch.ones(n, total, dtype=torch.bool, device=input_ids.device).tril(start)
        batch, d = input_ids.shape[0], self.embed.shape[1]
        h = F.embedding(input_ids.reshape(-1), self.embed)                 # (B n, d)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for i, layer in enumerate(self.layers):
            qkv = _project(rms_normalize(h, self.eps), layer.qkv, layer.qkv_bias)
            qk = qkv[:, :q_size + kv_size].view(batch, n, self.heads + self.kv_heads, self.head_dim)
            # Rotary embedding of q and k in one go.
            qk = (qk * cos + qk.roll(self.head_dim // 2, -1) * sin).transpose(1, 2)
            keys, values = cache.keys[i], cache.values[i]
            keys[:, :, start:total] = qk[:, self.heads:]
            values[:, :, start:total] = qkv[:, q_size + kv_size:].view(
                batch, n, self.kv_heads, self.head_dim).transpose(1, 2)
            o = F.scaled_dot_product_attention(qk[:, :self.heads], keys[:, :, :total],
                                               values[:, :, :total], attn_mask=mask,
                                               enable_gqa=self.heads != self.kv_heads)
            h = h + _project(o.transpose(1, 2).reshape(batch * n, q_size), layer.out, layer.out_bias)
            gate, up = (rms_normalize(h, self.eps) @ layer.gate_up).chunk(2, -1)
            h = h + (F.silu(gate) * up) @ layer.down
        cache.length = total if use_cache else start
        h = h.view(batch, n, d)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return CompactOutput(rms_normalize(h, self.eps) @ self.head)

    def _rope_at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos/sin rows for arbitrary (n,) positions."""
        self._rope(0, int(positions.max()) + 1)
        return self._cos[positions, None], self._sin[positions, None]

    def _rope(self, start: int, end: int) -> tuple[Tensor, Tensor]:
        """cos/sin rows for positions [start, end), from tables grown by doubling."""
        if end > self._cos.shape[0]:
            size = max(256, 2 * end)
            positions = torch.arange(size, dtype=torch.float32, device=self.device)
            angles = positions[:, None] * self.inv_freq.to(self.device)
            angles = torch.cat([angles, angles], dim=-1)
            half = angles.shape[1] // 2
            self._cos = (angles.cos() * self.rope_scale).to(self.embed.dtype)
            # transformers' rotate_half(x) = cat(-x2, x1) = roll(x, D/2) * (-1 on the first half)
            self._sin = (angles.sin() * self.rope_scale).to(self.embed.dtype)
            self._sin[:, :half] *= -1
        # (n, 1, D): broadcast over (B, n, heads, D)
        return self._cos[start:end, None], self._sin[start:end, None]


def _project(x: Tensor, weight_t: Tensor, bias: Tensor | None) -> Tensor:
    return x @ weight_t if bias is None else torch.addmm(bias, x, weight_t)


def _fuse(layer: Any) -> _Layer:
    attn, mlp = layer.self_attn, layer.mlp
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    biases = [p.bias for p in projections]
    return _Layer(
        qkv=_transposed(torch.cat([p.weight for p in projections]), layer.input_layernorm.weight),
        qkv_bias=None if biases[0] is None else torch.cat(biases).detach(),
        out=_transposed(attn.o_proj.weight),
        out_bias=None if attn.o_proj.bias is None else attn.o_proj.bias.detach(),
        gate_up=_transposed(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                            layer.post_attention_layernorm.weight),
        down=_transposed(mlp.down_proj.weight),
    )


def _transposed(weight: Tensor, norm_scale: Tensor | None = None) -> Tensor:
    """(out, in) -> contiguous (in, out), rows scaled by the preceding norm's scale if given."""
    weight_t = weight.detach().t()
    if norm_scale is not None:
        weight_t = norm_scale.detach()[:, None] * weight_t
    return weight_t.contiguous()


def check_compactable(model: Any) -> None:
    """Raise ValueError unless `model` is a transformers Llama the compact runtime reproduces."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    problem = None
    if model_type != "llama":
        problem = f"model_type {model_type!r}"
    elif getattr(config, "hidden_act", "silu") != "silu":
        problem = f"hidden_act {config.hidden_act!r}"
    elif getattr(config, "mlp_bias", False):
        problem = "an MLP with biases"
    elif not hasattr(getattr(getattr(model, "model", None), "rotary_emb", None), "inv_freq"):
        problem = "no rotary-embedding module"
    elif getattr(model.model.rotary_emb, "rope_type", "default") not in STATIC_ROPE:
        # `dynamic` / `longrope` recompute their frequencies with the sequence length.
        problem = f"rope_type {model.model.rotary_emb.rope_type!r}"
    if problem is not None:
        raise ValueError(f"the compact runtime supports Llama-architecture causal LMs (model_type "
                         f"'llama', SiLU MLP without bias, rope types {', '.join(STATIC_ROPE)}); "
                         f"this model has {problem}. Use the 'hf' runtime for it")


def resolve_runtime(model: Any, runtime: str) -> str:
    """`hf` or `compact`; `auto` picks `compact` when `model` supports it (right for drafts:
    their numerics never change a verified output).

    Raises:
        ValueError: an unknown runtime, or `compact` for a model it does not support.
    """
    if runtime not in RUNTIMES + ("auto",):
        raise ValueError(f"runtime must be one of {RUNTIMES + ('auto',)}, got {runtime!r}")
    if runtime == "auto":
        try:
            check_compactable(model)
        except ValueError:
            return "hf"
        return "compact"
    if runtime == "compact":
        check_compactable(model)
    return runtime


def with_runtime(model: Any, runtime: str) -> Any:
    """`model` itself (`hf`) or its `CompactCausalLM` (`compact`); see `resolve_runtime`."""
    return model if resolve_runtime(model, runtime) == "hf" else CompactCausalLM(model)
