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
