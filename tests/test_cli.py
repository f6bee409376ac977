"""The CLI through click's runner: success, JSON fields, and one-line usage errors (exit 2)."""

import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.config import DecodeConfig

TINY = ["--model", "tiny", "--gen-length", "16", "--block-length", "8"]


def run(*args, stdin=None):
    return CliRunner().invoke(main, list(args), input=stdin)


def test_json_output_has_the_documented_fields():
    result = run(*TINY, "--prompt", "w1 w2 w3", "--json", "-o", "threshold=0.8")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert {"text", "nfe", "tokens_per_step", "answer_tokens_per_step", "seconds", "model", "config"} <= out.keys()
    assert DecodeConfig.from_dict(out["config"]).to_dict() == out["config"]
    assert out["config"]["scheduler"] == {"name": "threshold", "threshold": 0.8}
    assert out["model"] == "tiny" and out["nfe"] >= 2
    assert out["tokens_per_step"] == pytest.approx(16 / out["nfe"])


def test_prompt_from_stdin():
    result = run(*TINY, "--scheduler", "low_confidence", "--json", stdin="w4 w5\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["nfe"] == 16


def test_list_shows_every_registry_with_defaults():
    result = run("list")
    assert result.exit_code == 0
    assert "schedulers:" in result.output and "caches:" in result.output and "filters:" in result.output
    assert "threshold (float) = 0.9" in result.output


@pytest.mark.parametrize("args, fragment", [
    (["--scheduler", "nope"], "unknown scheduler 'nope'; choose from"),
    (["-o", "threshold=2"], "threshold must be in (0, 1], got 2.0"),
    (["-o", "bogus=1"], "unknown option 'bogus'"),
    (["-o", "threshold=abc"], "expected float"),
    (["-o", "novalue"], "expected KEY=VALUE"),
    (["--gen-length", "10"], "multiple of block_length"),
    (["--gen-length", "0"], "gen_length must be >= 1"),
    (["--prompt", "   "], "the prompt is empty"),
    (["--gen-length", "640", "--block-length", "64"], "exceeds the model's context"),
])
def test_usage_errors_exit_2_with_one_clear_line(args, fragment):
    base = ["--model", "tiny", "--gen-length", "16", "--block-length", "8", "--prompt", "w1"]
    result = run(*base, *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("setup, fragment", [
    (lambda d: None, "does not exist"),
    (lambda d: d.mkdir(), "has no config.json"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text("{oops")), "not valid JSON"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "llada"}')), "lacks required key"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "gpt9"}')), "gpt9"),
])
def test_bad_model_directories_are_usage_errors(tmp_path, setup, fragment):
    directory = tmp_path / "model"
    setup(directory)
    result = run("--model", str(directory), "--prompt", "hi")
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


def test_ideal_model_decodes_a_task_prompt():
    result = run("--model", "ideal", "--gen-length", "8", "--block-length", "8",
                 "--prompt", "sort : mia ella hank", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["text"] == "ella hank mia"


def test_scheduler_fields_inline_as_in_eval_and_o_wins():
    result = run("--model", "tiny", "--gen-length", "8", "--block-length", "8", "--prompt", "w1 w2",
                 "--scheduler", "wino:threshold=0.5,max_accept=0", "-o", "max_accept=3", "--json")
    assert result.exit_code == 0, result.output
    scheduler = json.loads(result.output)["config"]["scheduler"]
    assert (scheduler["name"], scheduler["threshold"], scheduler["max_accept"]) == ("wino", 0.5, 3)
    bad = run("--model", "tiny", "--prompt", "w1", "--scheduler", "wino:bogus=1")
    assert bad.exit_code == 2 and "unknown option 'bogus'" in bad.output
