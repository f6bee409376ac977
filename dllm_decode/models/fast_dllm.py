"""Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_7B, _1.5B) in plain torch, under the released names.

Fast-dLLM v2 (arXiv 2509.26328) fine-tunes Qwen2.5-Instruct into a block-diffusion
model: the Qwen2 weights unchanged, attention bidirectional inside blocks of `bd_size` positions
and causal across blocks, and AR-style logits (the hidden state at i predicts the token at i + 1,
trained with the causal-LM loss on masked targets). This adapter undoes the shift, so row i
predicts the token AT i; the first position of a block therefore takes the last row of the
previous block, whose value cannot change while the block is decoded (block-causal: it never
sees the block). Same deliberate differences from the reference as the Dream adapter (padding
mask applied; position 0 keeps its own row; cached rows `(a, b)` also compute row a - 1).

Decoding rule (the reference's `batch_sample`): a block whose first position is on the grid and
still masked (every block after the prompt's, and the first one when the prompt ends on a
boundary) commits that position alone, its argmax, in the block's first step; its logit comes
from the forward that also writes the previous block into the KV cache (the block cache's fused
first step, or the prefill), so no forward is added. Only then do the block's denoising steps
run, seeing the committed token. A prompt that ends inside a block has no such step: that block
starts with prompt tokens. Differences that remain: at temperature > 0 the block start is sampled
like every other commit (the reference takes its argmax at any temperature); a prompt of exactly
one block gets the prompt as context (the reference prefills only prompts longer than a block, so
its first block then decodes without the prompt in its cache); [MASK] is never committed. The loop applies the rule to every model with `block_start_first`
(`models.block_grid`). Blocks are whole blocks of the grid: the canvas runs to the next
boundary after prompt + gen_length, and the answer is cut to gen_length.

The mask token `|<MASK>|` (151665) is added to the tokenizer, not to config.json; a
`mask_token_id` key in the file, when present, wins. `FastDLLMLlamaConfig` is the same recipe on
a Llama backbone (no attention bias): the toolkit's embedded block-diffusion model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from dllm_decode.models.decoder import DecoderConfig, DecoderLM
from dllm_decode.models.layers import BlockCausal


@dataclass(frozen=True)
class FastDLLMConfig(DecoderConfig):
    """Qwen2 keys plus `bd_size` (the training and decoding block); values as in the 7B release."""

    MODEL_TYPE: ClassVar[str] = "Fast_dLLM_Qwen"
    ARCHITECTURES: ClassVar[tuple[str, ...]] = ("Fast_dLLM_QwenForCausalLM",)
    EXTRA_KEYS: ClassVar[dict[str, Any]] = {"rope_scaling": None, "use_sliding_window": False,
                                            "attention_dropout": 0.0, "use_cache": False}
    BLOCK_KEY: ClassVar[str | None] = "bd_size"

    mask_token_id: int = 151665            # `|<MASK>|`, the first id after Qwen2.5's specials
    eos_token_id: int | tuple[int, ...] = 151645    # `<|im_end|>`, the reference stop token
    pad_token_id: int = 151643
    bd_size: int = 32
    attention_bias: bool = True            # q/k/v biases (Qwen2); False for the Llama variant


@dataclass(frozen=True)
class FastDLLMLlamaConfig(FastDLLMConfig):
    """The Fast-dLLM v2 recipe on a transformers Llama backbone (attention_bias false, head_dim
    stated): the layout the embedded block-diffusion model ships in."""

    MODEL_TYPE: ClassVar[str] = "fast_dllm_llama"
    ARCHITECTURES: ClassVar[tuple[str, ...]] = ("FastDLLMLlamaForBlockDiffusion",)
    EXTRA_KEYS: ClassVar[dict[str, Any]] = {"mlp_bias": False, "attention_dropout": 0.0,
                                            "use_cache": False}

    attention_bias: bool = False


class FastDLLMModel(BlockCausal, DecoderLM):
    """The DiffusionLM for Fast-dLLM v2 checkpoints: block-causal over `bd_size`, shift undone."""

    token_shift = 1

    def __init__(self, config: FastDLLMConfig):
        super().__init__(config, qkv_bias=config.attention_bias, qk_norm=False)
        self.block_size = config.bd_size
