"""Dream (Dream-org/Dream-v0-Base-7B / -Instruct-7B) in plain torch, under the released names.

Dream is Qwen2.5 continued as a masked diffusion model (Ye et al., 2025, arXiv 2508.15487): the
Qwen2 layout (q/k/v biases, untied `lm_head`, GQA) with the causal mask removed, RoPE applied in
the model dtype, and logits that are AR-style: the hidden state at i predicts the token at i + 1.
This adapter undoes that shift, so row i of the returned logits predicts the token AT i, as the
`DiffusionLM` contract requires. Deliberate differences from the reference, invisible on the
positions a decoder ever scores:
  * the padding mask is applied and pad queries attend to real keys (never NaN);
  * a row whose position is 0 (the first real token) keeps its own logit instead of the one of
    the pad before it (the reference's `shifted[:, 0] = raw[:, 0]`, applied per row);
  * under a filled KV cache, rows `(a, b)` with a > 0 also compute row a - 1 (its fresh K/V are
    written to the cache like the others), so row a gets its exact shifted logit
    (`shared/specs/models-and-caches.md` §4.6).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dllm_decode.models.layers import BlockStackLM, KVCache, PreNormBlock, RMSNorm

_ACCEPTED_ROPE_TYPES = {None, "default"}


@dataclass(frozen=True)
class DreamConfig:
    """The `config.json` fields the forward pass reads (names and values as in Dream-v0-7B)."""

    hidden_size: int = 3584
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int | None = 4
    intermediate_size: int = 18944
    vocab_size: int = 152064
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    max_position_embeddings: int = 32768       # `DreamConfig` default; the 7B value is unverified
    tie_word_embeddings: bool = False
    mask_token_id: int = 151666
    eos_token_id: int | tuple[int, ...] = 151643
    pad_token_id: int = 151643

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple "
                             f"of num_key_value_heads ({self.kv_heads})")

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        return tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "DreamConfig":
        """Build from a released `config.json`; structural values this code does not implement raise."""
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Dream config: hidden_act={raw['hidden_act']!r} is not supported; "
                             f"accepted: ['silu']")
        rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", rope.get("type"))
        if rope_type not in _ACCEPTED_ROPE_TYPES:
            raise ValueError(f"Dream config: rope type {rope_type!r} is not supported; "
                             f"accepted: ['default']")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in raw.items() if key in names}
        if "rope_theta" not in values and "rope_theta" in rope:    # transformers 5 nests it
            values["rope_theta"] = rope["rope_theta"]
        if isinstance(values.get("eos_token_id"), list):
            values["eos_token_id"] = tuple(values["eos_token_id"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The released layout: our fields plus the structural keys and HF bookkeeping."""
        fields = dataclasses.asdict(self)
        if isinstance(self.eos_token_id, tuple):
            fields["eos_token_id"] = list(self.eos_token_id)
        return {"model_type": "Dream", "architectures": ["DreamModel"], "hidden_act": "silu",
                "rope_scaling": None, "use_sliding_window": False, "attention_dropout": 0.0,
                "use_cache": False, **fields}


class DreamLayer(PreNormBlock):
    """Qwen2 decoder layer without the causal mask: q/k/v with bias, o_proj without."""

    def __init__(self, cfg: DreamConfig):
        super().__init__(cfg.num_attention_heads, cfg.kv_heads, rope_full_precision=False)
        d, kv_dim = cfg.hidden_size, cfg.kv_heads * cfg.head_dim
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.self_attn = nn.ModuleDict({
            "q_proj": nn.Linear(d, d, bias=True),
            "k_proj": nn.Linear(d, kv_dim, bias=True),
            "v_proj": nn.Linear(d, kv_dim, bias=True),
            "o_proj": nn.Linear(d, d, bias=False),
        })
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.mlp = nn.ModuleDict({
            "gate_proj": nn.Linear(d, cfg.intermediate_size, bias=False),   # activated
            "up_proj": nn.Linear(d, cfg.intermediate_size, bias=False),     # linear
            "down_proj": nn.Linear(cfg.intermediate_size, d, bias=False),
        })

    def parts(self) -> tuple[nn.Module, ...]:
        attn, mlp = self.self_attn, self.mlp
        return (self.input_layernorm, attn["q_proj"], attn["k_proj"], attn["v_proj"],
                attn["o_proj"], self.post_attention_layernorm, mlp["gate_proj"], mlp["up_proj"],
                mlp["down_proj"])


class _DreamBase(nn.Module):
    def __init__(self, cfg: DreamConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DreamLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DreamModel(BlockStackLM):
    """The DiffusionLM for Dream checkpoints (state dict keys `model.*` and `lm_head.weight`)."""

    def __init__(self, config: DreamConfig):
        super().__init__()
        self.config = config
        self.model = _DreamBase(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.mask_token_id = config.mask_token_id
        self.eos_token_ids: tuple[int, ...] = config.eos_token_ids
        self.vocab_size = config.vocab_size
        self.max_length: int | None = config.max_position_embeddings

    def parts(self) -> tuple[nn.Embedding, nn.ModuleList]:
        return self.model.embed_tokens, self.model.layers

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, kv: KVCache | None = None,
                rows: tuple[int, int] | None = None) -> Tensor:
        """Shifted logits (B, b - a, V) for canvas rows `rows = (a, b)`: row i predicts token i."""
        h, positions, (lo, a, b) = self.hidden_states(input_ids, attention_mask, positions, kv,
                                                      rows, lookback=1)
        h = self.model.norm(h)                              # (B, b - lo, d), canvas rows [lo, b)
        # The shift, on hidden states so the head runs on b - a rows only: row i reads row i - 1,
        # except a sequence start (position 0), which has no predecessor and keeps its own.
        previous = torch.cat([h[:, :1], h[:, :-1]], dim=1)[:, a - lo:]
        starts = (positions[:, a:b] == 0).unsqueeze(-1)
        h = torch.where(starts, h[:, a - lo:], previous)
        head = self.model.embed_tokens if self.config.tie_word_embeddings else self.lm_head
        return nn.functional.linear(h, head.weight).float()
