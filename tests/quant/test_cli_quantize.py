"""`dllm-decode quantize`, `--quantize`, GPTQ and the calibration sources."""

import json

import pytest
import torch
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.quant.codes import dequantize, quantize_weight
from dllm_decode.quant.gptq import gptq_int4
from dllm_decode.testing import tiny_llada


def _run(*args):
    return CliRunner().invoke(main, list(args))


def test_quantize_command_writes_a_checkpoint_that_decodes(tmp_path):
    out = tmp_path / "int8"
    result = _run("quantize", "--model", "embedded", "--out", str(out), "--format", "int8")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == "int8"
    assert (out / "tokenizer.json").is_file()
    decoded = _run("--model", str(out), "--prompt", "sort : carol alice bob", "--json")
    assert decoded.exit_code == 0, decoded.output
    assert json.loads(decoded.output.strip().splitlines()[-1])["text"].split() == ["alice", "bob", "carol"]


@pytest.mark.parametrize("args,hint", [
    (["--format", "int4:100"], "does not divide the input width 192"),
    (["--format", "int3"], "one of ['int8', 'int4', 'fp8']"),
    (["--format", "int8", "--calibration", "4"], "calibration (GPTQ) applies to int4"),
    (["--format", "int4:64", "--calibration", "513"], "513 is not in the range 0<=x<=512"),
])
def test_quantize_command_bad_input_is_a_usage_error(tmp_path, args, hint):
    result = _run("quantize", "--model", "embedded", "--out", str(tmp_path / "q"), *args)
    assert result.exit_code == 2
    assert hint in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (tmp_path / "q" / "model.safetensors").exists()


def test_quantize_option_on_decode():
    result = _run("--model", "embedded", "--prompt", "sort : carol alice bob", "--quantize",
                  "int4:64", "--json")
    assert result.exit_code == 0, result.output
    bad = _run("--model", "embedded", "--prompt", "x", "--quantize", "int4:x")
    assert bad.exit_code == 2 and "group size after ':' must be an integer" in bad.output


def test_gptq_beats_round_to_nearest_on_its_calibration_inputs():
    torch.manual_seed(0)
    weight = torch.randn(32, 64)
    mix = torch.randn(64, 64) * torch.linspace(0.1, 3, 64)         # correlated, uneven inputs
    x = torch.randn(512, 64) @ mix
    hessian = x.t() @ x
    gptq = dequantize(gptq_int4(weight, hessian, 16), "int4")
    rtn = dequantize(quantize_weight(weight, "int4", 16), "int4")
    error = lambda w: (x @ (w - weight).t()).pow(2).sum()   # noqa: E731
    assert error(gptq) < 0.8 * error(rtn)


def test_calibration_sources_feed_the_hessians():
    from dllm_decode.eval.harness.calibration import calibration_examples, record_hessians
    from dllm_decode.models import load_model

    model = load_model("embedded")
    examples = calibration_examples(4, seed=1)
    assert len(examples) == 4 and len({e.task for e in examples}) == 4
    decode = record_hessians(model, "decode", examples)
    clean = record_hessians(model, "clean", examples)
    path = "model.transformer.blocks.0.q_proj"
    assert decode.hessians[path].shape == (192, 192)
    # a decode runs one forward per step over prompt + canvas: many more rows than one pass
    assert decode.rows[path] > 2 * clean.rows[path] > 0
    assert model.runtime == "compact"                  # the recorder put the runtime back
    with pytest.raises(ValueError, match=r"\[1, 512\]"):
        calibration_examples(600)


@pytest.mark.parametrize("command", [[], ["eval"], ["serve"]])
def test_every_decoding_command_takes_quantize(command):
    result = _run(*command, "--help")
    assert result.exit_code == 0 and "--quantize" in result.output


def test_quantize_runs_the_compact_runtime():
    result = _run("--model", "embedded", "--prompt", "sort: 3 1 2", "--quantize", "int8", "--runtime", "compact")
    assert result.exit_code == 0, result.output
