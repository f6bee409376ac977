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
    (the logit a full forward would give it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from dllm_decode.models.decoder import DecoderConfig, DecoderLM


@dataclass(frozen=True)
class DreamConfig(DecoderConfig):
    """The `config.json` fields the forward pass reads (names and values as in Dream-v0-7B)."""

    MODEL_TYPE: ClassVar[str] = "Dream"
    ARCHITECTURES: ClassVar[tuple[str, ...]] = ("DreamModel",)
    EXTRA_KEYS: ClassVar[dict[str, Any]] = {"rope_scaling": None, "use_sliding_window": False,
                                            "attention_dropout": 0.0, "use_cache": False}

    max_position_embeddings: int = 32768       # `DreamConfig` default; the 7B value is unverified
    mask_token_id: int = 151666
    eos_token_id: int | tuple[int, ...] = 151643
    pad_token_id: int = 151643


class DreamModel(DecoderLM):
    """The DiffusionLM for Dream checkpoints: Qwen2 layout (q/k/v biases), no causal mask,
    AR-style logits shifted back (state dict keys `model.*` and `lm_head.weight`)."""

    token_shift = 1

    def __init__(self, config: DreamConfig):
        super().__init__(config, qkv_bias=True, qk_norm=False)
