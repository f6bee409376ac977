"""Quantized models run the compact runtime: q|k|v and gate|up fused from the quantized layers'
codes (no second copy), logits equal to the quantized reference runtime's within float rounding,
and the captured step over the fused quantized layers."""

from __future__ import annotations

import warnings

import pytest
import torch

from dllm_decode.models.compact import compact_problem, compact_stack, set_runtime
from dllm_decode.quant import QuantLinear, quantize_model, weight_bytes
from dllm_decode.testing import assert_logits_close, tiny_block_diffusion, tiny_llada

FORMATS = [("int8", None), ("fp8", None), ("int4", 16)]


def quantized(family: str, fmt: str, group: int | None, dtype=torch.float32):
    model = tiny_llada() if family == "llada" else tiny_block_diffusion(family, block_size=4)
    set_runtime(model.to(dtype), "compact")
    return quantize_model(model, fmt, group)


@pytest.mark.parametrize("family", ["llada", "fast_dllm", "sdar"])
@pytest.mark.parametrize("fmt,group", FORMATS)
def test_quantized_compact_equals_quantized_reference(family, fmt, group):
    model = quantized(family, fmt, group)
    assert compact_problem(model) is None and model.runtime == "compact"
    ids = torch.randint(0, model.vocab_size - 2, (2, 12))
    before = weight_bytes(model)
    compact = model(ids)
    block = compact_stack(model).blocks[0]
    assert isinstance(block.qkv, QuantLinear) and isinstance(block.gate_up, QuantLinear)
    q = model.get_submodule("model.transformer.blocks.0.q_proj" if family == "llada"
                            else "model.layers.0.self_attn.q_proj")
    assert q.weight_q.untyped_storage().data_ptr() == block.qkv.weight_q.untyped_storage().data_ptr()
    assert weight_bytes(model) == before                 # the fused codes are the layers' codes
    reference = set_runtime(model, "reference")(ids)
    assert_logits_close(compact, reference, ulps=64)


@pytest.mark.parametrize("fmt", ["int8", "int4:64"])
def test_quantized_embedded_model_loads_compact_in_bfloat16(fmt):
    """`load_model(quantize=)` runs compact; bf16 activations through the CPU int8 / int4
    kernels; a whole dual-cache decode of both runtimes."""
    from dllm_decode import DecodeConfig, generate
    from dllm_decode.models import load_model

    model = load_model("embedded", dtype=torch.bfloat16, quantize=fmt)
    assert model.runtime == "compact"
    ids = torch.randint(4, model.vocab_size - 2, (2, 12))
    compact = model(ids)
    reference = set_runtime(model, "reference")(ids)
    assert_logits_close(compact, reference, ulps=64)
    config = DecodeConfig.from_dict({"scheduler": {"name": "low_confidence"}, "cache": {"name": "dual"},
                                     "gen_length": 8, "block_length": 4})
    prompts = [model.tokenizer.encode("sort: 3 1 2"), model.tokenizer.encode("reverse: 4 5 6 7")]
    slow = generate(model, prompts, config).tokens
    fast = generate(set_runtime(model, "compact"), prompts, config).tokens
    assert (fast == slow).float().mean() >= 0.9


def test_captured_step_runs_the_fused_quantized_layers():
    from dllm_decode import DecodeConfig, generate

    model = quantized("llada", "int4", 16)
    config = DecodeConfig.from_dict({"scheduler": {"name": "low_confidence"}, "gen_length": 8,
                                     "block_length": 8})
    prompts = [[3, 4, 5, 6], [7, 8]]
    eager = generate(model, prompts, config)
    calls = []
    compact_stack(model).blocks[0].qkv.register_forward_hook(lambda *args: calls.append(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # no fallback to the eager step
        captured = generate(model, prompts, config, capture="static")
    assert torch.equal(captured.tokens, eager.tokens) and calls
