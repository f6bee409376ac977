"""A Llama-family transformers causal LM re-run as a lean plain-torch decoder (`--runtime compact`).

At the embedded models' size (1.8M and 0.25M parameters) a transformers forward costs about a
millisecond per decoder layer in Python dispatch (cache objects, mask building, hooks), not in
arithmetic: the 2-layer draft then costs 0.4 of the 4-layer target although it does 1/7 of the
FLOPs, and speculative decoding cannot pay off. This module runs the same weights with only the
tensor operations: fused QKV and gate/up projections, a preallocated KV cache that is cut back by
moving its length, rotary tables computed once. The block itself (`FusedBlock`, `RotaryTable`) is
the one the diffusion models' compact runtime runs (`dllm_decode/models/compact.py`). Logits match
the transformers model to float rounding (tested); it plugs into `kv.extend`/`kv.feed` like a
transformers model.

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

from dllm_decode.models.compact import FusedBlock, RotaryTable, transposed
from dllm_decode.models.layers import rms_normalize, sdpa

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
        self.head = transposed(source.lm_head.weight, inner.norm.weight)
        self.device = self.embed.device
        self.layers = [self._fuse(inner.layers[i]) for i in kept]
        rotary = inner.rotary_emb
        self.rotary = RotaryTable(rotary.inv_freq.to(self.device), self.embed.dtype,
                                  float(getattr(rotary, "attention_scaling", 1.0)))

    def _fuse(self, layer: Any) -> FusedBlock:
        """One transformers decoder layer as the shared `FusedBlock` (models/compact.py)."""
        attn, mlp = layer.self_attn, layer.mlp
        return FusedBlock.fuse(layer.input_layernorm.weight, attn.q_proj, attn.k_proj,
                               attn.v_proj, attn.o_proj, layer.post_attention_layernorm.weight,
                               mlp.gate_proj, mlp.up_proj, mlp.down_proj, heads=self.heads,
                               kv_heads=self.kv_heads, eps=self.eps)

    def new_cache(self, batch: int = 1) -> CompactCache:
        return CompactCache(len(self.layers), batch, self.kv_heads, self.head_dim,
                            self.embed.dtype, self.embed.device)

    def __call__(self, *args: Any, **kwargs: Any) -> CompactOutput:
        return self.forward(*args, **kwargs)   # looked up per call, so benchmarks can time it

    def forward(self, input_ids: Tensor, cache: CompactCache | None = None,
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
        if cache is not None and not isinstance(cache, CompactCache):
            raise TypeError(f"cache must be a CompactCache (from `new_cache()`), got "
                            f"{type(cache).__name__}")
        cache = cache if cache is not None else self.new_cache(input_ids.shape[0])
        start, n = cache.length, input_ids.shape[1]
        total = start + n
        cache.reserve(total)
        if position_ids is None:
            cos, sin = self.rotary.span(start, total)
        else:
            cos, sin = self.rotary.at(position_ids[0])
        # Causal mask for several fed tokens; a single token attends to everything cached.
        mask = attention_mask if custom else None
        if n > 1 and not custom:
            mask = torch.ones(n, total, dtype=torch.bool, device=input_ids.device).tril(start)
        h = F.embedding(input_ids, self.embed)                             # (B, n, d)
        for i, layer in enumerate(self.layers):
            q, k, v = layer.attention_inputs(h, cos, sin)
            keys, values = cache.keys[i], cache.values[i]
            keys[:, :, start:total] = k
            values[:, :, start:total] = v
            o = sdpa(q, keys[:, :, :total], values[:, :, :total], mask)
            h = layer.finish(h, o)
        cache.length = total if use_cache else start
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return CompactOutput(rms_normalize(h, self.eps) @ self.head)


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
