"""Tiny models for tests and `--model tiny`: a seeded random LLaDA and an oracle predictor."""

from __future__ import annotations

import functools

from typing import Any

import torch
from torch import Tensor, nn

from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM


def tiny_llada(seed: int = 0, vocab_size: int = 37, layers: int = 2, max_length: int = 512) -> LLaDAModelLM:
    """A seeded random LLaDA (width 32, odd vocab): exercises every code path, decodes noise.

    Mask id is the last id, EOS the one before it.
    """
    generator = torch.Generator().manual_seed(seed)
    config = LLaDAConfig(d_model=32, n_heads=4, n_layers=layers, mlp_hidden_size=48,
                         vocab_size=vocab_size, max_sequence_length=max_length,
                         mask_token_id=vocab_size - 1, eos_token_id=vocab_size - 2,
                         pad_token_id=vocab_size - 2)
    model = LLaDAModelLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3 if p.dim() > 1 else torch.ones(p.shape))
    model.ar_partner = functools.partial(tiny_llama, seed=seed, vocab_size=vocab_size)
    return model.eval()


def tiny_llama(seed: int = 0, vocab_size: int = 37, layers: int = 1) -> torch.nn.Module:
    """A seeded random causal Llama with `tiny_llada`'s vocabulary: its AR partner (the guide a
    rule like APD consults; `tiny_llada` declares it as `ar_partner`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    generator = torch.Generator().manual_seed(seed + 1)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=512, eos_token_id=vocab_size - 2,
                         pad_token_id=vocab_size - 2, bos_token_id=None)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3 if p.dim() > 1 else torch.ones(p.shape))
    model.tokenizer = None
    return model.eval()


class OracleMaskPredictor(nn.Module):
    """Puts probability `confidence[i]` on `target[i]` at every generated position i.

    Positions are counted from the generation start (the canvas tail of length G = len(target)),
    so a test can state exactly which positions a scheduler commits, and when. The rest of the
    probability is spread evenly over the other non-mask tokens.
    """

    supports_kv = False

    def __init__(self, target: Tensor, confidence: Tensor, vocab_size: int, mask_token_id: int,
                 eos_token_id: int):
        super().__init__()
        self.mask_token_id, self.eos_token_ids = mask_token_id, (eos_token_id,)
        self.vocab_size, self.max_length = vocab_size, None
        self.tokenizer = None
        rest = ((1 - confidence) / (vocab_size - 2)).unsqueeze(-1).repeat(1, vocab_size)
        probs = rest.clone()
        probs[torch.arange(target.numel()), target] = confidence
        probs[:, mask_token_id] = 0.0
        self.register_buffer("log_probs", probs.clamp_min(1e-30).log())

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, positions=None,
                kv=None, rows: tuple[int, int] | None = None) -> Tensor:
        batch, length = input_ids.shape
        gen = self.log_probs.shape[0]
        logits = torch.zeros(batch, length, self.vocab_size)
        logits[:, length - gen:] = self.log_probs
        a, b = rows if rows is not None else (0, length)
        return logits[:, a:b]


def tiny_tokenizer(vocab_size: int = 37):
    """Word-level tokenizer for `tiny_llada`: `[UNK]`, w1 … w{V-3}, `<|endoftext|>`, `<|mdm_mask|>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, vocab_size - 2)},
             "<|endoftext|>": vocab_size - 2, "<|mdm_mask|>": vocab_size - 1}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]",
                                   eos_token="<|endoftext|>", mask_token="<|mdm_mask|>")


def tiny_llada_with_tokenizer(seed: int = 0) -> LLaDAModelLM:
    """`tiny_llada` with `tiny_tokenizer` attached: the CLI's `--model tiny` (decodes noise)."""
    model = tiny_llada(seed)
    model.tokenizer = tiny_tokenizer(model.vocab_size)
    model.name_or_path = "tiny"
    return model


BLOCK_DIFFUSION_FAMILIES = ("fast_dllm", "sdar", "llada2")


def tiny_block_diffusion(family: str = "fast_dllm", seed: int = 0, block_size: int = 4,
                         layers: int = 2, vocab_size: int = 37, max_length: int = 512):
    """A seeded random block-diffusion model of `family` (width 32, odd vocab; decodes noise).

    `fast_dllm`: Qwen2 layout with the token shift; `sdar`: Qwen3 layout (q/k norms, head_dim 12
    != width / heads); `llada2`: one dense layer then MoE layers (8 experts in 4 groups, top-2
    of 2 groups, a shared expert, expert bias, partial rotary). Mask id is the last id, EOS the
    one before it. Matrices N(0, 0.3^2); norms, biases and expert biases random too.
    """
    from dllm_decode.models.fast_dllm import FastDLLMConfig, FastDLLMModel
    from dllm_decode.models.llada2 import LLaDA2Config, LLaDA2Model
    from dllm_decode.models.sdar import SDARConfig, SDARModel

    ids = dict(vocab_size=vocab_size, mask_token_id=vocab_size - 1, eos_token_id=vocab_size - 2,
               pad_token_id=vocab_size - 2)
    qwen = dict(hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=48, max_position_embeddings=max_length,
                rms_norm_eps=1e-6, rope_theta=10000.0, **ids)
    if family == "fast_dllm":
        model = FastDLLMModel(FastDLLMConfig(**qwen, bd_size=block_size))
    elif family == "sdar":
        model = SDARModel(SDARConfig(**qwen, head_dim=12, block_size=block_size))
    elif family == "llada2":
        model = LLaDA2Model(LLaDA2Config(
            hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, intermediate_size=48, moe_intermediate_size=16, num_experts=8,
            num_experts_per_tok=2, num_shared_experts=1, n_group=4, topk_group=2,
            first_k_dense_replace=1, use_bias=False, partial_rotary_factor=0.5,
            rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=max_length,
            block_size=block_size, **ids))
    else:
        raise ValueError(f"unknown family {family!r}; choose from {list(BLOCK_DIFFUSION_FAMILIES)}")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in list(model.parameters()) + [b for b in model.buffers() if b is not None]:
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(noise * 0.3 if p.dim() > 1 else 1 + 0.2 * noise)
    model.ar_partner = functools.partial(tiny_llama, seed=seed, vocab_size=vocab_size)
    return model.eval()


FLOAT32_ULPS = 32
"""How far logits of two DIFFERENT compute paths of one float32 model may differ, in float32 ulps
(machine epsilon, 2**-23) of the logits' scale (their largest magnitude, at least 1). Two paths
(the compact runtime and the reference blocks, a cached and an uncached forward, this package and
transformers) multiply the same numbers in different orders and matrix shapes, and ATen and the
BLAS pick their kernels per CPU (`ATEN_CPU_CAPABILITY`: default, avx2, avx512), so their rounding
differs by a few ulps per layer: the tiny test models (logits up to ~6) measured at most 11.3
ulps (avx512), 7.9 (avx2), 7.1 (default) over the model tests' 291 comparisons on an Intel Xeon;
32 leaves room for other CPUs. The same path on the same inputs stays bit-equal and is tested
exactly."""


TENSOR_PARALLEL_ULPS = FLOAT32_ULPS
"""How far float32 logits of a tensor-parallel model (`dllm_decode.parallel`) may be from the
same model in one process, in float32 ulps of the logits' scale (`logits_tolerance`). Sharding
splits each row-parallel matrix product into per-rank partial sums added by an all_reduce, and
the head's product into column blocks: a different summation order, nothing else. Measured at
TP = 2 over the tiny LLaDA (tied and untied), Dream (tied and untied), Fast-dLLM v2, SDAR and the
two embedded models in both runtimes: 3.7 to 7.5 ulps (`tests/distributed/test_tp.py`). The
same 32 ulps as two compute paths on one process."""


def logits_tolerance(expected: Tensor, ulps: int = FLOAT32_ULPS) -> dict[str, float]:
    """`torch.testing.assert_close` keywords for comparing logits from a different compute path
    with `expected`: an absolute bound of `ulps` float32 ulps of the logits' scale."""
    scale = max(float(expected.detach().abs().amax()), 1.0) if expected.numel() else 1.0
    return {"atol": ulps * torch.finfo(torch.float32).eps * scale, "rtol": 0.0}


def assert_logits_close(actual: Tensor, expected: Tensor, ulps: int = FLOAT32_ULPS) -> None:
    """Assert logits from a different compute path equal `expected` to float rounding
    (`logits_tolerance`)."""
    torch.testing.assert_close(actual, expected, **logits_tolerance(expected, ulps))


TINY_LOGIT_SCALE = 8.0
"""The largest logit magnitude of the seeded tiny test models (measured up to ~6)."""

PROBABILITY_ATOL = 2 * FLOAT32_ULPS * float(torch.finfo(torch.float32).eps) * TINY_LOGIT_SCALE
"""How far a softmax probability (a step's confidence) from two DIFFERENT compute paths of a tiny
test model may differ: a softmax moves by at most twice the largest change of its logits
(|dp_i| <= p_i (|dz_i| + sum_j p_j |dz_j|) <= 2 max |dz|), and the logits agree to
`FLOAT32_ULPS` ulps of their scale (`TINY_LOGIT_SCALE`): about 6.1e-5. A difference above it is
a real one (a stale K/V, another input), not rounding."""


def assert_probabilities_close(actual: Tensor, expected: Tensor) -> None:
    """Assert probabilities (confidences; -inf marks an ineligible slot and must match exactly)
    from a different compute path equal `expected` to float rounding (`PROBABILITY_ATOL`)."""
    torch.testing.assert_close(actual, expected, atol=PROBABILITY_ATOL, rtol=0.0)


def probabilities_differ(actual: Tensor, expected: Tensor) -> bool:
    """True when probabilities differ by more than rounding (`PROBABILITY_ATOL`) somewhere."""
    return not torch.allclose(actual, expected, atol=PROBABILITY_ATOL, rtol=0.0)


def tiny_diffusion_gemma(seed: int = 0, steps: int = 4) -> torch.nn.Module:
    """A seeded random DiffusionGemma (vocab 128, two layers: sliding and full, 4 experts,
    canvas 8) shipping a `steps`-step noise schedule, built without transformers."""
    from dllm_decode.models.diffusion_gemma import DiffusionGemmaConfig, DiffusionGemmaModel

    config = DiffusionGemmaConfig.from_dict({"canvas_length": 8, "text_config": {
        "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
        "num_global_key_value_heads": 1, "sliding_window": 8, "num_experts": 4, "top_k_experts": 2,
        "moe_intermediate_size": 16, "layer_types": ["sliding_attention", "full_attention"]}})
    model = DiffusionGemmaModel(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(noise * 0.3 if p.dim() > 1 else 1 + 0.2 * noise)
    model.generation_defaults = {"max_denoising_steps": steps}
    return model.eval()


def assert_decodes_agree(actual: Any, expected: Any, rows_may_flip: int = 1) -> None:
    """Assert two compute paths' greedy decodes (`DecodeResult`s: a cache against none, the
    compact runtime against the reference) give the same tokens and forwards, row by row,
    except at most `rows_may_flip` rows.

    A decode is discrete: where a step's deciding numbers (two confidences, or a confidence and
    a threshold) lie within float rounding of each other, another CPU's rounding
    (`FLOAT32_ULPS`) may take the other branch and that row differs from there on. The logits
    themselves are compared with `assert_logits_close`; this bounds how many rows a near tie may
    move. A broken path (stale K/V, a wrong mask) moves nearly every row.
    """
    assert actual.tokens.shape == expected.tokens.shape, (actual.tokens.shape, expected.tokens.shape)
    moved = [r for r in range(expected.tokens.shape[0])
             if not (torch.equal(actual.tokens[r], expected.tokens[r])
                     and int(actual.nfe[r]) == int(expected.nfe[r]))]
    assert len(moved) <= rows_may_flip, (
        f"rows {moved} of {expected.tokens.shape[0]} decode differently (at most {rows_may_flip} "
        f"may, from a near tie)")
