"""`dllm-decode eval` through click: the ideal and tiny models end to end, usage errors, plots."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.eval.harness.records import read_records

REQUIRED = {"task", "scheduler", "params", "accuracy", "nfe", "tokens_per_step", "seconds"}


def _run(*args: str):
    return CliRunner().invoke(main, ["eval", *args], catch_exceptions=False)


def test_ideal_grid_with_theory(tmp_path):
    result = _run("--model", "ideal", "--tasks", "shuffle,copy", "--scheduler", "random",
                  "--sweep", "tokens_per_step=1,6", "--limit", "4", "--gen-length", "answer",
                  "--out", str(tmp_path), "--json", "--no-plots")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert len(summary["results"]) == 4 and all(REQUIRED <= set(c) for c in summary["results"])
    cells = {(c["task"], c["params"]["tokens_per_step"]): c for c in summary["results"]}
    assert cells["copy", 6]["accuracy"] == 100.0          # C = 0: exact at any parallelism
    assert cells["shuffle", 1]["theory_accuracy"] > cells["shuffle", 6]["theory_accuracy"]
    assert cells["copy", 1]["theory_accuracy"] is None
    assert summary["tasks"]["shuffle"]["total_correlation_bits"] > 0
    (entry,) = summary["leaderboard"]
    assert set(entry["max_tokens_per_step"]) == set(entry["pb"]) == {"80", "75", "70"}
    assert entry["aup"] > 0
    assert len(read_records(tmp_path / "samples.jsonl")) == 16
    again = _run("--model", "ideal", "--tasks", "shuffle,copy", "--scheduler", "random",
                 "--sweep", "tokens_per_step=1,6", "--limit", "4", "--gen-length", "answer",
                 "--out", str(tmp_path), "--json", "--no-plots")
    assert json.loads(again.stdout)["results"] == summary["results"]      # resumed: nothing redone
    assert len(read_records(tmp_path / "samples.jsonl")) == 16


def test_tiny_model_end_to_end(tmp_path):
    result = _run("--model", "tiny", "--tasks", "copy", "--tasks", "sudoku", "--scheduler", "threshold",
                  "--scheduler", "low_confidence:tokens_per_step=2", "--limit", "2",
                  "--gen-length", "4", "--out", str(tmp_path), "--no-plots")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["configurations"]) == 2 and summary["num_samples"] == 8
    topk = next(c for c in summary["configurations"] if c["scheduler"] == "low_confidence")
    assert topk["tokens_per_step"] == 2.0 and topk["nfe"] == 2.0
    assert "| copy | threshold |" in (tmp_path / "report.md").read_text()


def test_answer_length_canvases_on_a_block_diffusion_model(tmp_path):
    """A block-diffusion model decodes whole blocks of its grid: an answer-length canvas is
    rounded up to them (the answer scored on its own tokens), not refused."""
    result = _run("--model", "embedded-bd", "--tasks", "copy", "--scheduler", "threshold", "--limit", "3",
                  "--gen-length", "answer", "--out", str(tmp_path), "--json", "--no-plots")
    assert result.exit_code == 0, result.output
    (cell,) = json.loads(result.stdout)["results"]
    assert cell["accuracy"] == 100.0
    records = read_records(tmp_path / "samples.jsonl")
    assert len(records) == 3 and any(r["gen_length"] % 8 for r in records)   # answers off the grid


@pytest.mark.parametrize("args, message", [
    (["--scheduler", "nope"], "unknown scheduler 'nope'"),
    (["--sweep", "tokens_per_step=1,2"], "applies to none of the schedulers"),
    (["--sweep", "threshold"], "expected KEY=V1,V2"),
    (["--sweep", "threshold=0.5,0.9", "--sweep", "threshold=0.7"], "'threshold' is given more than once"),
    (["--gen-length", "lots"], "expected an integer in [1, 1048576] or 'answer'"),
    (["--tasks", "nope"], "unknown task 'nope'"),
    (["--scheduler", "threshold:threshold=7"], "threshold"),
])
def test_usage_errors_exit_2(tmp_path, args, message):
    result = CliRunner().invoke(main, ["eval", "--model", "tiny", "--out", str(tmp_path), *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_plots_and_report_links(tmp_path):
    pytest.importorskip("matplotlib")
    result = _run("--model", "ideal", "--tasks", "replace_random", "--scheduler", "threshold",
                  "--sweep", "threshold=0.5,0.9", "--limit", "3", "--gen-length", "answer",
                  "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["plots"]) == 2
    report = (tmp_path / "report.md").read_text()
    for name in summary["plots"]:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
        assert f"]({name})" in report


def test_ideal_refuses_released_prompts_before_decoding(tmp_path):
    released = tmp_path / "released" / "waiting_line"
    released.mkdir(parents=True)
    (released / "copy.jsonl").write_text(json.dumps(
        {"input": {"context": '["Billy Ramos", "Alan Wells"]'}, "answer": '["Billy Ramos", "Alan Wells"]'}) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["eval", "--model", "ideal", "--tasks", f"released:{tmp_path / 'released'}",
                                       "--out", str(out), "--no-plots"])
    assert result.exit_code == 2, result.output
    assert "'Billy', 'Ramos'" in result.output and "released/copy" in result.output
    assert "Traceback" not in result.output and not (out / "samples.jsonl").exists()


def test_leaderboard_lines_speak_answer_tokens_per_forward(tmp_path):
    result = _run("--model", "ideal", "--tasks", "copy", "--scheduler", "low_confidence",
                  "--sweep", "tokens_per_step=1,2", "--limit", "2", "--gen-length", "8",
                  "--out", str(tmp_path), "--no-plots")
    assert result.exit_code == 0, result.output
    line = result.output.splitlines()[0]
    assert "answer tokens/forward PB80" in line and "AUP" in line and "canvas tokens/step" in line
    summary = json.loads((tmp_path / "summary.json").read_text())
    (entry,) = summary["leaderboard"]
    # copy of 3-6 names on a canvas of 8: the canvas counts EOS padding, the answer does not
    for point in entry["points"]:
        assert point["answer_tokens_per_step"] < point["tokens_per_step"]
    assert entry["pb"]["80"] == max(p["answer_tokens_per_step"] for p in entry["points"])
