"""`eval --combine`: runs of different models into one directory give one summary and plot."""

import json

from click.testing import CliRunner

from dllm_decode.cli import main


def run_eval(out, model, *extra):
    args = ["eval", "--model", model, "--tasks", "copy", "--scheduler", "threshold", "--limit", "2",
            "--gen-length", "8", "--out", str(out), "--no-progress", "--json", *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_combine_summarizes_every_model_in_the_directory(tmp_path):
    alone = run_eval(tmp_path, "tiny")
    assert [c["label"] for c in alone["configurations"]] == ["threshold"]
    combined = run_eval(tmp_path, "ideal", "--combine")
    labels = sorted(c["label"] for c in combined["configurations"])
    assert labels == ["ideal threshold", "tiny threshold"]
    assert combined["num_samples"] == 4
    ideal = next(c for c in combined["configurations"] if c["model"] == "ideal")
    assert ideal["mean_accuracy"] == 100.0            # the analytic model copies exactly
    assert combined["model"] == "ideal, tiny"


def test_without_combine_only_this_commands_runs_are_summarized(tmp_path):
    run_eval(tmp_path, "tiny")
    again = run_eval(tmp_path, "ideal")
    assert [c["model"] for c in again["configurations"]] == ["ideal"]
