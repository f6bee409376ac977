"""The transformers Llama / Qwen2 / Qwen3 decoder layout in plain torch, shared by Dream (Qwen2,
bidirectional), Fast-dLLM v2 (Qwen2 or Llama, block-causal) and SDAR (Qwen3, block-causal).

Parameter names are transformers' (`model.embed_tokens`, `model.layers.{i}.self_attn.{q,k,v,o}_proj`,
optional `.self_attn.{q,k}_norm`, `.mlp.{gate,up,down}_proj`, `model.norm`, `lm_head`), so a
released checkpoint loads without renaming. RoPE is applied in the model dtype as those models do.
A family fixes the attention pattern (the `key_mask` hook) and the token shift; the maths is here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from dllm_decode.models.layers import (BlockStackLM, KVCache, PreNormBlock, RMSNorm, SwiGLU,
                                      TiedHead)

_ACCEPTED_ROPE_TYPES = {None, "default"}


@dataclass(frozen=True)
class DecoderConfig:
    """The `config.json` fields the forward pass reads (names as transformers writes them).

    Defaults are Qwen2.5-7B's; each family overrides its token ids. `head_dim` None means
    `hidden_size // num_attention_heads` (Qwen2); Qwen3 and Llama files state it. Families with
    blocks name their block-size key in `BLOCK_KEY` (validated here: a positive int).
    """

    MODEL_TYPE: ClassVar[str] = ""
    ARCHITECTURES: ClassVar[tuple[str, ...]] = ()
    EXTRA_KEYS: ClassVar[dict[str, Any]] = {}     # structural keys written by `to_dict`
    BLOCK_KEY: ClassVar[str | None] = None

    hidden_size: int = 3584
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int | None = 4
    intermediate_size: int = 18944
    vocab_size: int = 152064
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    mask_token_id: int = 151666
    eos_token_id: int | tuple[int, ...] = 151643
    pad_token_id: int = 151643
    head_dim: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "head_dim", checked_head_dim(
            self.hidden_size, self.num_attention_heads, self.kv_heads, self.head_dim))
        check_mask_id(self.mask_token_id, self.vocab_size)
        if self.BLOCK_KEY is not None:
            check_block_size(self.BLOCK_KEY, getattr(self, self.BLOCK_KEY))

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        return tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "DecoderConfig":
        """Build from a released `config.json`; structural values this code does not implement raise."""
        name = cls.MODEL_TYPE
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{name} config: hidden_act={raw['hidden_act']!r} is not supported; "
                             f"accepted: ['silu']")
        for key in ("mlp_bias", "use_sliding_window"):
            if raw.get(key, False):
                raise ValueError(f"{name} config: {key}=true is not supported; accepted: [false]")
        rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", rope.get("type"))
        if rope_type not in _ACCEPTED_ROPE_TYPES:
            raise ValueError(f"{name} config: rope type {rope_type!r} is not supported; "
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
        return {"model_type": self.MODEL_TYPE, "architectures": list(self.ARCHITECTURES),
                "hidden_act": "silu", **self.EXTRA_KEYS, **fields}


def checked_head_dim(hidden: int, heads: int, kv_heads: int, head_dim: int | None) -> int:
    """`head_dim` (default `hidden // heads`) after checking the head counts fit together."""
    if head_dim is None:
        if hidden % heads:
            raise ValueError(f"hidden_size ({hidden}) must be divisible by num_attention_heads "
                             f"({heads})")
        head_dim = hidden // heads
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads ({heads}) must be a multiple of "
                         f"num_key_value_heads ({kv_heads})")
    return head_dim


def check_mask_id(mask_token_id: int, vocab_size: int) -> None:
    if not 0 <= mask_token_id < vocab_size:
        raise ValueError(f"mask_token_id {mask_token_id} is outside the vocabulary "
                         f"(vocab_size {vocab_size})")


def check_block_size(key: str, value: Any) -> None:
    """A block size must be a positive int (bool excluded); the message names the key."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer (the model's block size), got {value!r}")


class DecoderLayer(PreNormBlock):
    """One transformers decoder layer: q/k/v (bias optional), optional per-head q/k RMSNorm,
    o_proj without bias, SwiGLU MLP."""

    def __init__(self, cfg: DecoderConfig, qkv_bias: bool, qk_norm: bool):
        super().__init__(cfg.num_attention_heads, cfg.kv_heads, rope_full_precision=False)
        d, q_dim, kv_dim = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.self_attn = nn.ModuleDict({
            "q_proj": nn.Linear(d, q_dim, bias=qkv_bias),
            "k_proj": nn.Linear(d, kv_dim, bias=qkv_bias),
            "v_proj": nn.Linear(d, kv_dim, bias=qkv_bias),
            "o_proj": nn.Linear(q_dim, d, bias=False),
        })
        if qk_norm:
            self.self_attn["q_norm"] = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.self_attn["k_norm"] = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.mlp = SwiGLU(d, cfg.intermediate_size)

    def parts(self) -> tuple[nn.Module, ...]:
        attn, mlp = self.self_attn, self.mlp
        return (self.input_layernorm, attn["q_proj"], attn["k_proj"], attn["v_proj"],
                attn["o_proj"], self.post_attention_layernorm, mlp.gate_proj, mlp.up_proj,
                mlp.down_proj)

    def qk_norms(self) -> tuple[nn.Module | None, nn.Module | None]:
        attn = self.self_attn
        return (attn["q_norm"], attn["k_norm"]) if "q_norm" in attn else (None, None)


class _Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, qkv_bias, qk_norm)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def unshift(h: Tensor, positions: Tensor, lo: int, a: int, b: int) -> Tensor:
    """AR-style hidden states (row i predicts i + 1) -> rows `[a, b)` predicting their own position.

    `h` holds canvas rows `[lo, b)` with `lo = max(a - 1, 0)`. Row i reads row i - 1, except a
    sequence start (position 0), which has no predecessor and keeps its own (the reference
    `cat(logits[:, :1], logits[:, :-1])`, applied per row so left padding does not matter).
    """
    previous = torch.cat([h[:, :1], h[:, :-1]], dim=1)[:, a - lo:]
    starts = (positions[:, a:b] == 0).unsqueeze(-1)
    return torch.where(starts, h[:, a - lo:], previous)


class DecoderLM(BlockStackLM):
    """A DiffusionLM over the transformers decoder layout (state dict keys `model.*`, `lm_head.weight`).

    Subclasses set `token_shift` (1: the network's row i predicts i + 1, undone here) and, for
    block-diffusion families, the block-causal `key_mask` (`layers.BlockCausal`).
    """

    token_shift: int = 0

    def __init__(self, config: DecoderConfig, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        self.config = config
        self.model = _Decoder(config, qkv_bias, qk_norm)
        # called as a module (a parallel plan replaces it); tied: the embedding, no weights
        self.lm_head = (TiedHead(self.model.embed_tokens) if config.tie_word_embeddings else
                        nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        self.mask_token_id = config.mask_token_id
        self.eos_token_ids: tuple[int, ...] = config.eos_token_ids
        self.vocab_size = config.vocab_size
        self.max_length: int | None = config.max_position_embeddings

    def parts(self) -> tuple[nn.Embedding, nn.ModuleList]:
        return self.model.embed_tokens, self.model.layers

    def head(self, h: Tensor) -> Tensor:
        """Final-norm hidden states (B, Lq, d) -> float32 logits (B, Lq, V)."""
        return self.lm_head(h).float()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, kv: KVCache | None = None,
                rows: tuple[int, int] | None = None) -> Tensor:
        """Logits (B, b - a, V) for canvas rows `rows = (a, b)`: row i predicts the token AT i.

        A shifted family also computes row a - 1 (under a filled cache too, writing its fresh
        K/V like the others), so row a gets its exact shifted logit.
        """
        h, positions, (lo, a, b) = self.hidden_states(input_ids, attention_mask, positions, kv,
                                                      rows, lookback=self.token_shift)
        h = self.model.norm(h)                              # (B, b - lo, d), canvas rows [lo, b)
        # The shift, on hidden states so the head runs on b - a rows only.
        h = unshift(h, positions, lo, a, b) if self.token_shift else h
        return self.head(h)

    def verify_forward(self, input_ids: Tensor, key_mask: Tensor, positions: Tensor,
                       rows: tuple[int, int]) -> Tensor:
        """The network's own logits (B, b - a, V) of fed rows `rows = (a, b)` under an explicit
        attention pattern `key_mask` (B, 1, L, L) bool (True = attend) at explicit `positions`
        (duplicates allowed), no cache. The shift is NOT undone: a token-shifted family's row i
        predicts position i + 1. Self-speculative verifiers run the same weights in another mode
        with it (a block model with block size 1 is autoregressive)."""
        h, _, _ = self.hidden_states(input_ids, None, positions, None, rows, key_mask=key_mask)
        return self.head(self.model.norm(h))
