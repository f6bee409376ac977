"""Datasheet peaks by device name and the roofline floors, against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.devices import DEVICE_PEAKS, device_peaks
from dllm_decode.eval.bench.roofline import Forward, ModelShape, floor, forward_plan
from dllm_decode.eval.bench.shaped import ShapedOptions, shaped_model

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def llada_8b() -> ModelShape:
    # the real shape on the meta device: no memory
    return ModelShape.of(shaped_model(ShapedOptions(shape="llada-8b", dtype="bfloat16", device="meta")))


@pytest.mark.parametrize("name, key", [
    (H100, "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("AMD Instinct MI300X", "MI300X")])
def test_device_names_as_torch_reports_them(name, key):
    assert device_peaks(name) is DEVICE_PEAKS[key]


@pytest.mark.parametrize("name", ["cpu", "NVIDIA H100", "NVIDIA GeForce RTX 3090", "mps", ""])
def test_an_unlisted_or_ambiguous_device_has_no_peaks(name):
    assert device_peaks(name) is None


def test_peaks_are_dense_datasheet_figures():
    h100 = DEVICE_PEAKS["H100 SXM"]
    assert h100.hbm_bytes_per_s == 3.35e12 and h100.flops_for("bfloat16") == pytest.approx(989.4e12)
    assert DEVICE_PEAKS["H200"].hbm_bytes_per_s == 4.8e12
    for peaks in DEVICE_PEAKS.values():
        assert peaks.flops_for("fp32") < peaks.flops_for("bf16") and peaks.source
        assert 0.5e12 < peaks.hbm_bytes_per_s < 6e12


def test_llada_8b_parameter_counts(llada_8b):
    # blocks: 32 x (4 d^2 + 3 d F) + norms; head and embedding: 126,464 x 4,096 each
    assert llada_8b.block_params == 32 * (4 * 4096**2 + 3 * 4096 * 12288 + 2 * 4096) + 4096
    assert llada_8b.head_params == llada_8b.embedding_params == 126464 * 4096
    assert (llada_8b.layers, llada_8b.width, llada_8b.kv_width, llada_8b.bytes_per_param) == (32, 4096, 4096, 2)


def test_weight_read_floor_of_llada_8b_on_an_h100(llada_8b):
    """~15.0 GB of blocks and head (the embedding is only gathered) / 3.35 TB/s = 4.48 ms; all
    8.0 B parameters would be 16.0 GB, 4.79 ms."""
    h100 = device_peaks(H100)
    assert llada_8b.weight_bytes == pytest.approx(14.995e9, rel=1e-3)
    one_row = floor(llada_8b, [Forward(1, 1, 1)], 1, h100, "bfloat16")
    assert 1000 * one_row.read_seconds == pytest.approx(4.476, abs=0.01)
    total = (llada_8b.block_params + llada_8b.head_params + llada_8b.embedding_params) * 2
    assert total / h100.hbm_bytes_per_s * 1000 == pytest.approx(4.785, abs=0.01)


def test_compute_floor_and_the_ridge(llada_8b):
    """320 rows: 2 x 6.98e9 x 320 + 2 x 0.518e9 x 32 + 4 x 32 x 4096 x 320^2 = 4.552 TFLOP ->
    4.60 ms at 989.4 TFLOP/s, just above the 4.53 ms read floor (320 rows is past the ~295-row
    ridge); 32 rows are read-bound."""
    h100 = device_peaks(H100)
    full = floor(llada_8b, [Forward(320, 32, 320)], 1, h100, "bfloat16")
    flops = 2 * llada_8b.block_params * 320 + 2 * llada_8b.head_params * 32 + 4 * 32 * 4096 * 320 * 320
    assert full.compute_seconds == pytest.approx(flops / 989.4e12)
    assert 1000 * full.compute_seconds == pytest.approx(4.60, abs=0.01)
    assert 1000 * full.read_seconds == pytest.approx(4.53, abs=0.01)
    assert full.seconds == full.compute_seconds
    cached = floor(llada_8b, [Forward(32, 32, 320)], 1, h100, "bfloat16")
    assert cached.seconds == cached.read_seconds and cached.compute_seconds < cached.read_seconds / 5


def test_decode_floors_match_the_published_h100_table(llada_8b):
    """The no-cache decode (prompt 64, gen 256, block 32, 2 steps per block): 4.72 ms per forward
    at batch 1 and 18.9 ms at batch 4 (compute-bound)."""
    h100 = device_peaks(H100)
    plan = forward_plan("none", 64, 256, 32, 2)
    assert len(plan) == 16
    assert floor(llada_8b, plan, 1, h100, "bfloat16").ms_per_forward == pytest.approx(4.72, abs=0.01)
    assert floor(llada_8b, plan, 4, h100, "bfloat16").ms_per_forward == pytest.approx(18.88, abs=0.02)


def test_unknown_device_or_dtype_has_no_floor(llada_8b):
    assert floor(llada_8b, forward_plan("dual", 64, 256, 32, 2), 1, None, "bfloat16") is None
    assert floor(llada_8b, [Forward(1, 1, 1)], 1, device_peaks(H100), "int8") is None


def test_forward_plans():
    dual = forward_plan("dual", 64, 256, 32, 2)
    assert dual[0] == Forward(320, 32, 320) and dual[1] == Forward(32, 32, 320) and len(dual) == 16
    prefix = forward_plan("prefix", 64, 256, 32, 2)
    assert prefix[3] == Forward(256 - 32, 256 - 32, 320)
    block = forward_plan("block", 8, 32, 16, 2)       # grid blocks [0,16) [16,32) [32,48)
    assert [f.rows_fed for f in block] == [16, 16, 32, 16, 32, 16] and block[-1].keys == 48
    with pytest.raises(ValueError, match="d2"):
        forward_plan("d2", 8, 32, 16, 2)


def test_shape_of_a_model_without_a_known_config_is_refused():
    with pytest.raises(ValueError, match="cannot read a model shape"):
        ModelShape.of(torch.nn.Linear(2, 2))
