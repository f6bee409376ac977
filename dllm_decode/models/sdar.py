"""SDAR (JetLM/SDAR-{1.7B,4B,8B}-Chat) in plain torch, under the released names.

SDAR (arXiv 2510.06303) continues Qwen3 as a block-diffusion model: the Qwen3
layout (per-head q/k RMSNorm before RoPE, no attention bias, GQA, `head_dim` stated in the
config), attention bidirectional inside blocks of `block_size` positions and causal across
blocks. There is no token shift: training scores each masked position's own hidden state, so row
i already predicts position i. The MoE variant (`sdar_moe`, 30B-A3B) is not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from dllm_decode.models.decoder import DecoderConfig, DecoderLM
from dllm_decode.models.layers import BlockCausal


@dataclass(frozen=True)
class SDARConfig(DecoderConfig):
    """Qwen3 keys plus `block_size` (training block) and `mask_token_id`; defaults SDAR-8B-Chat's
    token ids (sizes are the config's, always)."""

    MODEL_TYPE: ClassVar[str] = "sdar"
    ARCHITECTURES: ClassVar[tuple[str, ...]] = ("SDARForCausalLM",)
    EXTRA_KEYS: ClassVar[dict[str, Any]] = {"rope_scaling": None, "use_sliding_window": False,
                                            "attention_dropout": 0.0, "use_cache": False}
    BLOCK_KEY: ClassVar[str | None] = "block_size"

    mask_token_id: int = 151669            # `<|MASK|>`
    eos_token_id: int | tuple[int, ...] = 151643
    pad_token_id: int = 151643
    block_size: int = 4
    attention_bias: bool = False


class SDARModel(BlockCausal, DecoderLM):
    """The DiffusionLM for SDAR checkpoints: block-causal over `block_size`, no shift."""

    token_shift = 0

    def __init__(self, config: SDARConfig):
        super().__init__(config, qkv_bias=config.attention_bias, qk_norm=True)
        self.block_size = config.block_size
