"""QuantLinear and quantize_model: codes, kernels against dequantize-then-matmul, every family."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dllm_decode.quant import (QuantError, QuantLinear, QuantSpec, check_group_size, dequantize,
                               quantize_model, quantize_weight, weight_bytes)
from dllm_decode.quant.codes import pack_int4, unpack_int4
from dllm_decode.testing import assert_logits_close, tiny_block_diffusion, tiny_llada

CASES = [("int8", None), ("fp8", None), ("int4", 32), ("int4", 64)]
# The torchao kernels and dequantize-then-matmul sum the same products in another order (int4:
# the CPU kernel accumulates in its own tiles): allowed difference relative to the output scale.
KERNEL_RTOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _linear(out_features=64, in_features=128, bias=True, seed=0):
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.normal_(0, 0.2)
    return layer


@pytest.mark.parametrize("fmt,group", CASES)
def test_codes_are_within_half_a_step_of_the_weight(fmt, group):
    w = _linear().weight.detach()
    codes = quantize_weight(w, fmt, group)
    error = (dequantize(codes, fmt) - w).abs()
    if fmt == "int8":
        assert (error <= codes.scale.float() * 0.5 + 1e-6).all()
    elif fmt == "int4":
        step = codes.scale.float().repeat_interleave(group, 1)
        assert (error <= step * 0.5 + 1e-4).all()
    else:                                     # e4m3: 3 mantissa bits, relative step 2^-3
        assert (error <= w.abs() * 2 ** -4 + codes.scale.float() * 2 ** -9 + 1e-6).all()
    assert error.max() > 0                    # it did quantize


def test_int4_packing_round_trips():
    codes = torch.randint(0, 16, (6, 10), dtype=torch.int32)
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (6, 5)
    assert torch.equal(unpack_int4(packed), codes)
    assert torch.equal(packed[0, 0] & 0xF, codes[0, 0].to(torch.uint8))     # even k: low nibble


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt,group", CASES)
def test_torchao_kernel_equals_dequantize_then_matmul(fmt, group, dtype):
    layer = _linear().to(dtype)
    quant = QuantLinear.from_linear(layer, fmt, group)
    assert quant.torchao_runs(torch.device("cpu"))
    x = torch.randn(3, 5, 128).to(dtype)
    y = quant(x)
    expected = F.linear(x.float(), quant.dequantized(torch.float32), layer.bias.float())
    assert y.dtype == dtype and y.shape == (3, 5, 64)
    scale = expected.abs().max()
    assert (y.float() - expected).abs().max() <= KERNEL_RTOL[dtype] * scale
    fallback = QuantLinear.from_linear(layer, fmt, group, kernel="dequant")
    assert (fallback(x).float() - expected).abs().max() <= KERNEL_RTOL[dtype] * scale


def test_int4_falls_back_where_the_cpu_kernel_refuses_the_shape():
    layer = _linear(out_features=40, in_features=64)          # 40 rows: not a multiple of 16
    quant = QuantLinear.from_linear(layer, "int4", 16)
    assert not quant.torchao_runs(torch.device("cpu"))
    x = torch.randn(4, 64)
    torch.testing.assert_close(quant(x), F.linear(x, quant.dequantized(), layer.bias),
                               rtol=1e-5, atol=1e-5)


def test_to_dtype_keeps_the_stored_codes():
    quant = QuantLinear.from_linear(_linear(), "fp8")
    codes = quant.weight_q.clone()
    quant.to(torch.bfloat16)
    assert quant.weight_q.dtype == torch.float8_e4m3fn and quant.weight_scale.dtype == torch.float16
    assert torch.equal(quant.weight_q.view(torch.uint8), codes.view(torch.uint8))
    assert quant.bias.dtype == torch.bfloat16


def _swapped(model):
    return {n for n, m in model.named_modules() if isinstance(m, QuantLinear)}


@pytest.mark.parametrize("family", ["llada", "fast_dllm", "sdar", "llada2"])
@pytest.mark.parametrize("fmt,group", [("int8", None), ("fp8", None), ("int4", 16)])
def test_every_family_quantizes_its_linears_and_experts(family, fmt, group):
    model = tiny_llada() if family == "llada" else tiny_block_diffusion(family)
    linears = {n for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and m.out_features != model.vocab_size}
    ids = torch.randint(0, model.vocab_size - 2, (2, 12))
    float_model = copy.deepcopy(model)
    quantize_model(model, fmt, group)
    assert _swapped(model) == linears and linears
    if family == "llada2":
        assert any(".experts." in n for n in linears) and any("shared_experts" in n for n in linears)
    # the float model with each weight replaced by what its codes stand for
    with torch.no_grad():
        for name, layer in model.named_modules():
            if isinstance(layer, QuantLinear):
                float_model.get_submodule(name).weight.copy_(layer.dequantized())
    expected = float_model(ids)
    assert_logits_close(model(ids), expected, ulps=64)


def test_quantized_model_is_smaller_by_the_target_ratios():
    # the embedded model's layout (width 192, MLP 512, vocab 129) in bfloat16
    from dllm_decode.models import load_model

    sizes, linear_sizes = {}, {}
    for fmt, group in [(None, None), ("int8", None), ("fp8", None), ("int4", 64)]:
        model = load_model("embedded", dtype=torch.bfloat16)
        if fmt:
            quantize_model(model, fmt, group)
        sizes[fmt] = weight_bytes(model)
        linear_sizes[fmt] = sum(weight_bytes(m) for m in model.modules()
                                if isinstance(m, (nn.Linear, QuantLinear))
                                and getattr(m, "out_features", 0) != model.vocab_size)
    assert sizes["int8"] <= 0.52 * sizes[None] and sizes["fp8"] <= 0.52 * sizes[None]
    # exact: 4 blocks of 442,368 linear weights, a bf16 embedding and head (2 x 129 x 192) and
    # norms; int8/fp8 add one float16 scale per output row, int4:64 a float16 scale and a uint8
    # zero point per 64 weights (0.5 + 3/64 bytes a weight: 0.2734x of bf16 for the linears)
    assert sizes == {None: 3_641_472, "int8": 1_887_872, "fp8": 1_887_872, "int4": 1_070_208}
    assert linear_sizes["int4"] == 1_769_472 * (0.5 + 3 / 64) == 0.2734375 * linear_sizes[None]
    assert sizes["int4"] <= 0.30 * sizes[None]          # 0.294x with the bf16 embedding and head


def test_bad_requests_are_one_line_errors():
    with pytest.raises(QuantError, match=r"one of \['int8', 'int4', 'fp8'\]"):
        QuantSpec("int3")
    with pytest.raises(QuantError, match="group_size must be a positive integer"):
        QuantSpec("int4", 0)
    with pytest.raises(QuantError, match="must be an integer"):
        QuantSpec.parse("int4:x")
    assert QuantSpec.parse("int4:64") == QuantSpec("int4", 64) and str(QuantSpec("int4")) == "int4:128"
    with pytest.raises(QuantError, match="int4 only"):
        QuantSpec("int8", 64)
    with torch.device("meta"):
        model = tiny_llada()                       # width 32: group 64 cannot divide it
    with pytest.raises(QuantError) as err:
        check_group_size(model, QuantSpec("int4", 64))
    assert "does not divide the input width 32" in str(err.value) and "\n" not in str(err.value)


def test_without_torchao_every_layer_dequantizes(monkeypatch):
    from dllm_decode.quant import torchao_bridge

    layer = _linear()
    quant = QuantLinear.from_linear(layer, "int4", 32)
    x = torch.randn(2, 128)
    with_torchao = quant(x)
    monkeypatch.setattr(torchao_bridge, "torchao_available", lambda: False)
    assert not quant.torchao_runs(torch.device("cpu"))
    torch.testing.assert_close(quant(x), with_torchao, rtol=1e-5, atol=1e-5)
