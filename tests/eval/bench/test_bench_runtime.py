"""`dllm-decode bench runtime`: reference vs compact forwards side by side (tiny model, seconds)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from dllm_decode.cli import main


def test_bench_runtime_prints_every_kind_and_writes_json(tmp_path):
    out = tmp_path / "runtime.json"
    result = CliRunner().invoke(main, ["bench", "runtime", "--quick", "--model", "tiny",
                                       "--batch-size", "1", "--batch-size", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "cached 8-row step" in result.output and "full, last 16 rows" in result.output
    rows = json.loads(out.read_text())["runtime"]
    assert [(r["batch"], r["kind"]) for r in rows] == [(b, k) for b in (1, 2)
                                                       for k in ("full", "mid", "cached")]
    assert all(r["argmax_equal"] and r["max_abs_diff"] < 1e-4 and r["speedup"] > 0 for r in rows)


def test_bench_runtime_takes_a_dtype(tmp_path):
    out = tmp_path / "runtime.json"
    result = CliRunner().invoke(main, ["bench", "runtime", "--quick", "--model", "tiny", "--repeats", "1",
                                       "--dtype", "bfloat16", "--device", "cpu", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["dtype"] == "torch.bfloat16" and report["device"] == "cpu"
    assert "bfloat16 on cpu" in result.output
    assert all(r["argmax_equal"] and r["max_abs_diff"] < 0.5 for r in report["runtime"])


def test_bench_runtime_refuses_a_missing_device():
    result = CliRunner().invoke(main, ["bench", "runtime", "--quick", "--model", "tiny", "--device", "tpu:9"])
    assert result.exit_code == 2 and "--device" in result.output and "Traceback" not in result.output
