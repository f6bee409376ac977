"""Quantized checkpoints: this package's round trip, and the layouts the field ships
(compressed-tensors FP8, GPTQ int4) packed here from known weights by their documented formulas."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dllm_decode.models import load_model
from dllm_decode.models.checkpoint import ModelLoadError
from dllm_decode.quant import QuantLinear, QuantSpec, quantize_model
from dllm_decode.quant.checkpoint import save_quantized
from dllm_decode.quant.device import check_device_runs
from dllm_decode.quant.spec import QuantError
from dllm_decode.testing import assert_logits_close, tiny_llada

IDS = torch.tensor([[3, 5, 7, 11, 2, 36, 36, 36, 36, 36]])


@pytest.fixture
def float_dir(tmp_path):
    model = tiny_llada()
    model.save_pretrained(tmp_path / "float")
    return tmp_path / "float"


def _config(directory):
    return json.loads((directory / "config.json").read_text())


def _quantized(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


@pytest.mark.parametrize("fmt,dtypes", [
    ("int8", {"weight_q": "I8", "weight_scale": "F16"}),
    ("fp8", {"weight_q": "F8_E4M3", "weight_scale": "F16"}),
    ("int4:16", {"weight_q": "U8", "weight_scale": "F16", "weight_zero": "U8"})])
def test_save_quantize_load_round_trip(float_dir, tmp_path, fmt, dtypes):
    model = load_model(float_dir, quantize=fmt)
    out = save_quantized(model, tmp_path / "q", _config(float_dir), float_dir)
    assert _config(out)["quantization_config"]["quant_method"] == "dllm-decode"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        stored = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    for suffix, dtype in dtypes.items():
        assert stored[f"model.transformer.blocks.0.q_proj.{suffix}"] == dtype
    assert stored["model.transformer.wte.weight"] == "F32"      # embeddings stay float
    loaded = load_model(out)
    assert loaded.quantization == QuantSpec.parse(fmt)
    for name, layer in _quantized(model).items():
        twin = _quantized(loaded)[name]
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype == torch.float8_e4m3fn
                   else torch.equal(a, b) for a, b in zip(layer.codes(), twin.codes()) if a is not None)
    assert_logits_close(loaded(IDS), model(IDS), ulps=4)
    with pytest.raises(ModelLoadError, match="already quantized"):
        load_model(out, quantize="int8")


def test_int8_codes_read_from_a_file_run_the_cpu_kernel_in_bfloat16(float_dir, tmp_path):
    # safetensors hands out views at unaligned offsets; aten's int8 kernel must not see them
    out = save_quantized(load_model(float_dir, quantize="int8"), tmp_path / "q", _config(float_dir))
    loaded = load_model(out, dtype=torch.bfloat16)
    expected = load_model(out)(IDS.repeat(4, 1))
    got = loaded(IDS.repeat(4, 1))                               # 40 rows through each layer
    assert (got.float() - expected).abs().max() <= 0.05 * expected.abs().max()


def test_unknown_quantization_config_is_one_line(float_dir):
    config = _config(float_dir)
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (float_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as err:
        load_model(float_dir)
    message = str(err.value)
    assert "'awq'" in message and "compressed-tensors" in message and "gptq" in message
    assert "\n" not in message


def _replace_state(directory, update, quantization):
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    state = update(state)
    save_file(state, str(directory / "model.safetensors"))
    config = _config(directory)
    config["quantization_config"] = quantization
    (directory / "config.json").write_text(json.dumps(config))


LINEAR_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "attn_out.weight",
                   "ff_proj.weight", "up_proj.weight", "ff_out.weight")


def _linear_names(state):
    return [k for k in state if k.startswith("model.transformer.blocks.") and k.endswith(LINEAR_SUFFIXES)]


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_compressed_tensors_fp8(float_dir, strategy):
    expected = {}

    def compress(state):
        for name in _linear_names(state):
            w = state.pop(name)
            scale = (w.abs().amax(1, keepdim=True) if strategy == "channel" else w.abs().amax().reshape(1)) / 448
            scale = scale.to(torch.bfloat16)
            q = (w / scale.float().reshape(-1, 1)).to(torch.float8_e4m3fn)
            module = name[:-len(".weight")]
            state[name], state[f"{module}.weight_scale"] = q, scale
            state[f"{module}.input_scale"] = torch.ones(1, dtype=torch.bfloat16)   # dropped
            expected[module] = q.float() * scale.float().reshape(-1, 1)
        return state

    _replace_state(float_dir, compress, {
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
        "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
        "config_groups": {"group_0": {"targets": ["Linear"], "format": "float-quantized",
                                      "weights": {"num_bits": 8, "type": "float",
                                                  "strategy": strategy, "symmetric": True}}}})
    model = load_model(float_dir)
    layers = _quantized(model)
    assert set(layers) == set(expected)
    for module, weight in expected.items():
        torch.testing.assert_close(layers[module].dequantized(), weight, rtol=0, atol=0)


def test_compressed_tensors_refuses_block_scales(float_dir):
    config = {"quant_method": "compressed-tensors", "format": "float-quantized",
              "config_groups": {"g": {"format": "float-quantized", "weights": {
                  "num_bits": 8, "type": "float", "strategy": "block"}}}}
    _replace_state(float_dir, lambda s: s, config)
    with pytest.raises(ModelLoadError, match="strategy 'block'.*accepted: float-quantized FP8"):
        load_model(float_dir)


def _pack_rows(values):
    """(K, N) nibbles -> (K/8, N) int32, input 8r + j at bits 4j of word r (GPTQModel)."""
    k, n = values.shape
    words = torch.zeros(k // 8, n, dtype=torch.int64)
    for j in range(8):
        words |= values[j::8].long() << (4 * j)
    return (words - (words >= 2 ** 31).long() * 2 ** 32).to(torch.int32)


def _gptq_state(group, v1, expected, permute=False):
    def pack(state):
        for name in _linear_names(state):
            w = state.pop(name).float().t()                             # (K, N) as GPTQ holds it
            k, n = w.shape
            g = w.reshape(k // group, group, n)
            low, high = g.amin(1), g.amax(1)
            scale = ((high - low) / 15).clamp_min(1e-5).half()          # (K/G, N)
            zero = (-low / scale.float()).round().clamp(0, 15)           # integer zero points
            q = (w / scale.float().repeat_interleave(group, 0) + zero.repeat_interleave(group, 0))
            q = q.round().clamp(0, 15)
            module = name[:-len(".weight")]
            expected[module] = (scale.float().repeat_interleave(group, 0)
                                * (q - zero.repeat_interleave(group, 0))).t()
            stored_zero = zero - 1 if v1 else zero
            state[f"{module}.qweight"] = _pack_rows(q)
            state[f"{module}.qzeros"] = _pack_rows(stored_zero.t()).t().contiguous()
            state[f"{module}.scales"] = scale
            g_idx = torch.arange(k, dtype=torch.int32) // group
            state[f"{module}.g_idx"] = g_idx.flip(0) if permute else g_idx
        return state
    return pack


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_gptq_int4_dequantizes_to_the_packed_values(float_dir, fmt):
    expected = {}
    _replace_state(float_dir, _gptq_state(16, fmt == "gptq", expected), {
        "quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": False, "sym": False,
        "checkpoint_format": fmt, "pack_dtype": "int32"})
    model = load_model(float_dir)
    layers = _quantized(model)
    assert set(layers) == set(expected)
    for module, weight in expected.items():
        step = layers[module].weight_scale.float().repeat_interleave(16, 1)
        # the float zero scale * (8 - z) is stored in float16: within 1/256 of a step
        assert ((layers[module].dequantized() - weight).abs() <= step / 256).all()


def test_gptq_refusals_are_one_line(float_dir):
    _replace_state(float_dir, _gptq_state(16, True, {}, permute=True), {
        "quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": True})
    with pytest.raises(ModelLoadError, match="permuted g_idx"):
        load_model(float_dir)
    config = _config(float_dir)
    config["quantization_config"]["bits"] = 3
    (float_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="bits 3 is not supported; accepted: 4"):
        load_model(float_dir)


def test_fp8_on_a_device_that_cannot_run_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (8, 0))
    with pytest.raises(QuantError, match=r"compute capability >= 8.9.*has 8.0; use int8"):
        check_device_runs(QuantSpec("fp8"), torch.device("cuda"))
    check_device_runs(QuantSpec("int8"), torch.device("cuda"))          # int8 runs anywhere
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    check_device_runs(QuantSpec("fp8"), torch.device("cuda"))
    with pytest.raises(QuantError, match="not on mps"):
        check_device_runs(QuantSpec("fp8"), torch.device("mps"))


def test_quantized_model_keeps_the_float_model_answers_on_round_to_nearest_int8(float_dir):
    float_model = load_model(float_dir)
    quant = quantize_model(load_model(float_dir), "int8")
    assert (quant(IDS).argmax(-1) == float_model(IDS).argmax(-1)).float().mean() > 0.8
