"""`--filter learned:...` / `--filter eotp` through the CLI, and `train-filter`."""

import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.filters import LearnedFilter

BASE = ["--model", "tiny", "--prompt", "w1 w2 w3", "--gen-length", "16", "--block-length", "8",
        "--scheduler", "low_confidence"]


def test_filters_build_from_cli_and_are_named_in_json(step_weights):
    path = step_weights(8)
    result = CliRunner().invoke(main, [*BASE, "--json", "--filter", f"learned:weights={path},width=8,mode=only",
                                       "--filter", "eotp:mode=predicted,eos_threshold=0.5"])
    assert result.exit_code == 0, result.output
    filters = json.loads(result.output)["config"]["filters"]
    assert filters == [{"name": "learned", "weights": path, "width": 8, "threshold": 0.96, "mode": "only"},
                       {"name": "eotp", "mode": "predicted", "eos_threshold": 0.5}]


def test_missing_weights_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, [*BASE, "--filter", f"learned:weights={tmp_path / 'none.safetensors'}"])
    assert result.exit_code == 2 and "not found at" in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_train_filter_writes_loadable_weights(tmp_path):
    out = tmp_path / "f.safetensors"
    result = CliRunner().invoke(main, ["train-filter", "--model", "tiny", "--out", str(out), "--per-task", "1",
                                       "--gen-length", "8", "--block-length", "8", "--width", "8",
                                       "--epochs", "3", "--rounds", "1", "--beta", "0.25", "--balance"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    assert report["rounds"] == 1 and report["balance"] and report["round_reports"][0]["beta"] == 0.25
    assert report["width"] == 8 and set(report["heldout"]) >= {"precision", "recall", "false_positive_rate"}
    assert LearnedFilter(weights=str(out), width=8).width == 8
