"""LLaDA (GSAI-ML/LLaDA-8B-Base / -Instruct) in plain torch, under the released parameter names.

Same maths as the reference `modeling_llada.py` (Nie et al., 2025, arXiv 2502.09992) for the
configuration the released checkpoints use (`block_type: llama`, RMSNorm, RoPE, SiLU-gated FFN,
no biases), with two deliberate differences, both invisible on unpadded input:
  * the padding mask is applied (the reference builds it and then calls attention with
    `attn_mask=None`, so padding attends and is attended to);
  * rotary positions count only attended tokens, so a left-padded row equals the unpadded one.
The embedded default model uses this architecture and on-disk layout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from dllm_decode.models.layers import BlockStackLM, KVCache, PreNormBlock, RMSNorm, TiedHead

_REQUIRED_STRUCTURE = {  # config values this implementation covers, as in the released checkpoints
    "block_type": {"llama"}, "activation_type": {"silu"}, "layer_norm_type": {"rms"},
    "rope": {True}, "alibi": {False, None}, "block_group_size": {1, None},
    "attention_layer_norm": {False, None}, "scale_logits": {False, None},
    "input_emb_norm": {False, None},
}


@dataclass(frozen=True)
class LLaDAConfig:
    """The `config.json` fields the forward pass reads (names as in the released file)."""

    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int | None = None
    n_layers: int = 32
    mlp_hidden_size: int = 12288
    vocab_size: int = 126464
    embedding_size: int | None = None
    max_sequence_length: int = 4096
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    rope_full_precision: bool = True
    include_bias: bool = False
    include_qkv_bias: bool = False
    weight_tying: bool = False
    mask_token_id: int = 126336
    eos_token_id: int = 126081
    pad_token_id: int = 126081

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def logit_columns(self) -> int:
        return self.embedding_size or self.vocab_size

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "LLaDAConfig":
        """Build from a released `config.json`; structural values this code does not implement raise."""
        for key, accepted in _REQUIRED_STRUCTURE.items():
            if key in raw and raw[key] not in accepted:
                raise ValueError(f"LLaDA config: {key}={raw[key]!r} is not supported; "
                                 f"accepted: {sorted(map(str, accepted))}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in raw.items() if key in names})

    def to_dict(self) -> dict[str, Any]:
        """The released layout: our fields plus the structural keys and HF bookkeeping."""
        return {"model_type": "llada", "architectures": ["LLaDAModelLM"],
                "block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms",
                "layer_norm_with_affine": True, "bias_for_layer_norm": False, "rope": True,
                "alibi": False, "block_group_size": 1, "attention_layer_norm": False,
                "scale_logits": False, "input_emb_norm": False, "multi_query_attention": None,
                "use_cache": False, **dataclasses.asdict(self)}


class LLaDABlock(PreNormBlock):
    """One pre-norm block: bidirectional attention, then the SiLU-gated FFN."""

    def __init__(self, cfg: LLaDAConfig):
        super().__init__(cfg.n_heads, cfg.kv_heads, cfg.rope_full_precision)
        qkv_bias = cfg.include_bias or cfg.include_qkv_bias
        kv_dim = cfg.kv_heads * cfg.head_dim
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, kv_dim, bias=qkv_bias)
        self.attn_out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.include_bias)
        self.ff_norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.ff_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden_size, bias=cfg.include_bias)  # activated
        self.up_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden_size, bias=cfg.include_bias)  # linear
        self.ff_out = nn.Linear(cfg.mlp_hidden_size, cfg.d_model, bias=cfg.include_bias)

    def parts(self) -> tuple[nn.Module, ...]:
        return (self.attn_norm, self.q_proj, self.k_proj, self.v_proj, self.attn_out,
                self.ff_norm, self.ff_proj, self.up_proj, self.ff_out)


class _LLaDATransformer(nn.Module):
    def __init__(self, cfg: LLaDAConfig):
        super().__init__()
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(cfg.logit_columns, cfg.d_model),
            "blocks": nn.ModuleList(LLaDABlock(cfg) for _ in range(cfg.n_layers)),
            "ln_f": RMSNorm(cfg.d_model, cfg.rms_norm_eps),
        })
        # the head is always called as a module (a parallel plan replaces it); tied: no weights
        self.transformer["ff_out"] = (TiedHead(self.transformer["wte"]) if cfg.weight_tying else
                                      nn.Linear(cfg.d_model, cfg.logit_columns, bias=cfg.include_bias))


class LLaDAModelLM(BlockStackLM):
    """The DiffusionLM for LLaDA checkpoints (state dict keys `model.transformer.*`)."""

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        self.config = config
        self.model = _LLaDATransformer(config)
        self.mask_token_id = config.mask_token_id
        self.eos_token_ids: tuple[int, ...] = (config.eos_token_id,)
        self.vocab_size = config.logit_columns
        self.max_length: int | None = config.max_sequence_length

    def parts(self) -> tuple[nn.Embedding, nn.ModuleList]:
        return self.model.transformer["wte"], self.model.transformer["blocks"]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, kv: KVCache | None = None,
                rows: tuple[int, int] | None = None) -> Tensor:
        """Logits (B, b - a, V) for canvas rows `rows = (a, b)` (default all); see `DiffusionLM`."""
        h, _, _ = self.hidden_states(input_ids, attention_mask, positions, kv, rows)
        return self.head(self.model.transformer["ln_f"](h))

    def head(self, h: Tensor) -> Tensor:
        """Final-norm hidden states (B, Lq, d) -> float32 logits (B, Lq, V), the head called as a
        module (`ff_out`, or the embedding through `TiedHead`)."""
        return self.model.transformer["ff_out"](h).float()
