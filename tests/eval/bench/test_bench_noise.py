"""`bench shaped` on the DiffusionGemma shapes: the 26B-A4B's sizes counted on the meta device,
its roofline's counts checked by hand, and a reduced run on the CPU end to end."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.devices import device_peaks
from dllm_decode.eval.bench.noise_roofline import NoiseForward, NoiseShape, plan
from dllm_decode.eval.bench.roofline import floor
from dllm_decode.eval.bench.shaped import ShapedOptions, _build, format_shaped, model_bytes
from dllm_decode.eval.bench.shaped_noise import run_noise_shaped


def _meta(shape: str, **changes):
    options = ShapedOptions(shape=shape, **changes)
    with torch.device("meta"):
        return _build(options, "noise").to(torch.bfloat16)


def test_the_26b_shape_has_the_released_counts():
    """25.2 B parameters, 3.8 B active per token (the model card's figures), 5 : 1 layer types."""
    model = _meta("diffusion-gemma-26b-a4b")
    shape = NoiseShape.of(model)
    total = sum(p.numel() for p in model.parameters())
    active = shape.shared_params + shape.layers * shape.top_k * shape.expert_params + shape.sc_params + \
        shape.vocab * shape.hidden
    assert 25.2e9 <= total < 25.3e9 and 3.8e9 <= active < 3.9e9
    assert shape.sliding.count(False) == 5 and shape.layers == 30
    assert shape.q_widths[:6] == (4096,) * 5 + (8192,) and shape.kv_widths[:6] == (2048,) * 5 + (1024,)
    assert shape.expert_params == 3 * 704 * 2816 and shape.bytes_per_param == 2
    # --layers: 1 keeps the (last, full) layer, 2 adds a sliding one; built in float32 before the cast
    one, two = (model_bytes(ShapedOptions(shape="diffusion-gemma-26b-a4b", layers=n), "noise") for n in (1, 2))
    assert two - one == 4 * sum(p.numel() for p in model.model.decoder.layers[0].parameters())


def test_a_decoder_step_reads_what_it_multiplies():
    shape = NoiseShape.of(_meta("diffusion-gemma-tiny"))          # 2 layers: sliding (W 8), full
    assert shape.experts_read(1) == pytest.approx(2) and shape.experts_read(10_000) == pytest.approx(4)
    step = NoiseForward(True, rows=8, committed=20, soft=True)
    experts = 2 * shape.experts_read(8) * shape.expert_params
    kv = 2 * (32 * (7 + 8) + 32 * (20 + 8))                     # sliding keeps W-1, full keeps all
    embedding_twice = 2 * 128 * 32
    expected = (shape.shared_params + experts + shape.sc_params + embedding_twice + kv + 8 * 32) * 2
    assert step.bytes(shape, 1) == pytest.approx(expected)
    first = NoiseForward(True, rows=8, committed=20, soft=False)
    assert step.bytes(shape, 1) - first.bytes(shape, 1) == pytest.approx(128 * 32 * 2)
    forwards = plan(prompt_length=5, gen_length=16, canvas=8, steps=3)
    assert [(f.decoder, f.rows, f.committed, f.soft) for f in forwards[:5]] == [
        (False, 5, 0, False), (True, 8, 5, False), (True, 8, 5, True), (True, 8, 5, True), (False, 8, 5, False)]
    assert len(forwards) == 8
    h200 = device_peaks("NVIDIA H200")
    bound = floor(shape, forwards, 1, h200, "bfloat16")
    assert bound.forwards == 8 and bound.seconds >= max(bound.read_seconds, bound.compute_seconds)
    assert floor(shape, forwards, 1, None, "bfloat16") is None


def test_a_reduced_run_decodes_every_forward_and_prints():
    options = ShapedOptions(shape="diffusion-gemma-tiny", layers=1, dtype="float32", batch_sizes=(1, 2),
                            gen_length=16, block_length=8, steps_per_block=3, prompt_length=5, repeats=1,
                            variants=("eager", "captured"))
    report = run_noise_shaped(options)
    eager = [r for r in report["rows"] if r["available"]]
    assert [r["batch"] for r in eager] == [1, 2]
    assert all(r["nfe"] == 2 * (1 + 3) for r in eager)           # per canvas: encoder + 3 steps
    assert report["forwards_per_decode"] == 8 and eager[0]["forwards"] == 2 * 8   # 2 prompts at B=1
    captured = [r for r in report["rows"] if r["variant"] == "captured"]
    assert captured and all("not yet one the loop chooses" in r["note"] for r in captured)
    text = format_shaped(report)
    assert "diffusion-gemma-tiny, 1 layers" in text and "unknown device" in text


def test_the_command_line_takes_the_shape_and_refuses_partial_canvases():
    args = ["bench", "shaped", "--shape", "diffusion-gemma-tiny", "--layers", "1", "--dtype", "float32",
            "--batch", "1", "--gen-length", "16", "--block-length", "8", "--steps-per-block", "2",
            "--prompt-length", "4", "--repeats", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "reference                      eager     -" in result.output
    with pytest.raises(ValueError, match="unknown shape 'gemma'"):
        dataclasses.replace(ShapedOptions(), shape="gemma")
