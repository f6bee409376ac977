"""The `diffusion_gemma` config.json (nested `text_config`) as the reference's configuration
class reads it (transformers 5.24 `configuration_diffusion_gemma.py`): its defaults for absent
keys and what its `__post_init__` derives (layer types, per-layer head dims and kv heads)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROPE_TYPES = ("default", "proportional")
LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class DiffusionGemmaConfig:
    """The text stack and canvas fields of a `diffusion_gemma` config.json (the reference
    class defaults for absent keys). Per-layer head dims and kv-head counts are resolved once."""

    vocab_size: int = 262144
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 30
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    sliding_window: int = 512
    final_logit_softcapping: float = 30.0
    num_experts: int = 0
    top_k_experts: int = 0
    moe_intermediate_size: int = 0
    max_position_embeddings: int = 131072
    layer_types: tuple[str, ...] = ()
    layer_head_dims: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    rope: dict[str, tuple[str, float, float, float]] = field(default_factory=dict)
    canvas_length: int = 256
    image_token_id: int = 258880
    eos_token_id: int | None = 1
    pad_token_id: int | None = 0
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = self.num_hidden_layers
        if not (len(self.layer_types) == len(self.layer_head_dims) == len(self.layer_kv_heads) == n):
            raise ValueError(f"layer_types must name {n} layers, got {len(self.layer_types)}")
        if bad := sorted(set(self.layer_types) - set(LAYER_TYPES)):
            raise ValueError(f"layer type {bad[0]!r} is not supported; accepted: {list(LAYER_TYPES)}")
        for kind in set(self.layer_types):
            if kind not in self.rope or self.rope[kind][0] not in ROPE_TYPES:
                raise ValueError(f"rope_parameters[{kind!r}] {self.rope.get(kind)!r} is not supported; "
                                 f"accepted rope_type: {list(ROPE_TYPES)}")
        for i, (d, kv) in enumerate(zip(self.layer_head_dims, self.layer_kv_heads)):
            if d < 2 or d % 2 or kv < 1 or self.num_attention_heads % kv:
                raise ValueError(f"layer {i}: head_dim {d} must be even and num_key_value_heads {kv} "
                                 f"must divide num_attention_heads {self.num_attention_heads}")
        if self.num_experts < 1 or not 0 < self.top_k_experts <= self.num_experts \
                or self.moe_intermediate_size < 1:
            raise ValueError(f"num_experts ({self.num_experts}), top_k_experts "
                             f"({self.top_k_experts}) and moe_intermediate_size must be set, "
                             f"with 1 <= top_k_experts <= num_experts")
        if self.canvas_length < 1 or self.sliding_window < 2:
            raise ValueError(f"canvas_length ({self.canvas_length}) must be >= 1 and sliding_window "
                             f"({self.sliding_window}) >= 2")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "DiffusionGemmaConfig":
        """Read a released config.json (nested `text_config`), resolving what the reference's
        `__post_init__` derives: layer types (5 sliding : 1 full, last layer full), the
        per-layer head dims and kv heads (`per_layer_config`, or `global_head_dim` /
        `num_global_key_value_heads`), the halved window under bidirectional attention."""
        text = raw.get("text_config") or {}
        if not isinstance(text, dict):
            raise ValueError("text_config must be a JSON object")
        if text.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_activation {text['hidden_activation']!r} is not supported; "
                             f"accepted: ['gelu_pytorch_tanh']")
        if text.get("attention_bias"):
            raise ValueError("attention_bias true is not supported; accepted: false")
        bidirectional = text.get("use_bidirectional_attention")
        if bidirectional not in (None, "vision"):
            raise ValueError(f"use_bidirectional_attention {bidirectional!r} is not supported; "
                             f"accepted: null or 'vision' (a causal text encoder)")
        n = int(text.get("num_hidden_layers", 30))
        types = list(text.get("layer_types") or
                     ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)])
        if types:
            types[-1] = "full_attention"           # the reference forces the last layer full
        head_dim, kv_heads = int(text.get("head_dim", 256)), int(text.get("num_key_value_heads", 4))
        overrides = text.get("per_layer_config")
        if overrides is None:
            full = {"head_dim": text.get("global_head_dim", 512)}
            if text.get("num_global_key_value_heads") is not None and text.get("attention_k_eq_v", True):
                full["num_key_value_heads"] = text["num_global_key_value_heads"]
            overrides = {str(i): full for i, t in enumerate(types) if t == "full_attention"}
        per_layer = [dict(overrides.get(str(i), overrides.get(i, {})) or {}) for i in range(len(types))]
        rope_raw = text.get("rope_parameters") or {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1e6}}
        rope = {kind: (str(p.get("rope_type", "default")), float(p.get("rope_theta", 10000.0)),
                       float(p.get("partial_rotary_factor", 1.0)), float(p.get("factor", 1.0)))
                for kind, p in rope_raw.items() if isinstance(p, dict)}
        return cls(vocab_size=int(text.get("vocab_size", 262144)),
                   hidden_size=int(text.get("hidden_size", 2304)),
                   intermediate_size=int(text.get("intermediate_size", 9216)),
                   num_hidden_layers=n, num_attention_heads=int(text.get("num_attention_heads", 8)),
                   num_key_value_heads=kv_heads, head_dim=head_dim,
                   rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
                   sliding_window=int(text.get("sliding_window", 512)),
                   final_logit_softcapping=float(text.get("final_logit_softcapping") or 30.0),
                   num_experts=int(text.get("num_experts") or 0),
                   top_k_experts=int(text.get("top_k_experts") or 0),
                   moe_intermediate_size=int(text.get("moe_intermediate_size") or 0),
                   max_position_embeddings=int(text.get("max_position_embeddings", 131072)),
                   layer_types=tuple(types),
                   layer_head_dims=tuple(int(p.get("head_dim", head_dim)) for p in per_layer),
                   layer_kv_heads=tuple(int(p.get("num_key_value_heads", kv_heads)) for p in per_layer),
                   rope=rope, canvas_length=int(raw.get("canvas_length", 256)),
                   image_token_id=int(raw.get("image_token_id", 258880)),
                   eos_token_id=_first(text.get("eos_token_id", 1)),
                   pad_token_id=_first(text.get("pad_token_id", 0)), raw=raw)

    def to_dict(self) -> dict[str, Any]:
        """The config.json this was read from (the reference layout)."""
        return dict(self.raw)


def _first(value: Any) -> int | None:
    return value[0] if isinstance(value, list) and value else value
