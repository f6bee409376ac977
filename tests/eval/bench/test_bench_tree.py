"""The side-by-side benchmark of trees, staged, BiLD and self-speculation (no timing assertions)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_run_reports_every_family_and_exact_ones_are_identical():
    from dllm_decode.eval.bench.spec_tree import TreeOptions, format_tree, run

    report = run(TreeOptions(per_task=1, repeats=1, runtimes=("compact",), tree_branch=3, tree_budget=8,
                             tree_min_prob=0.0, bild_rollbacks=(None, 3.0), self_per_task=1,
                             self_repeats=1, draft_steps=4))
    rows = {row["label"]: row for row in report["ar"]["compact"]["rows"]}
    assert set(rows) >= {"plain AR greedy", "chain, heuristic", "tree 3/8, heuristic",
                         "staged >lookup, heuristic", "BiLD fallback 0.6, exact",
                         "BiLD fallback 0.6, rollback 3"}
    for label, row in rows.items():
        if "rollback" not in label:                 # every exact method: plain AR's tokens
            assert row["identical_rate"] == 1.0, label
        assert {"cpu_speedup", "speedup", "nodes_per_call", "accuracy"} <= row.keys()
    assert rows["tree 3/8, heuristic"]["mean_accepted_tokens"] >= rows["chain, heuristic"]["mean_accepted_tokens"]
    assert rows["tree 3/8, heuristic"]["nodes_per_call"] <= 8
    selfspec = {row["label"]: row for row in report["self_speculation"]["rows"]}
    assert all(row["identical_rate"] == 1.0 for row in selfspec.values())
    assert selfspec["self-spec of it, K=4"]["forwards"] < selfspec["one token per step"]["forwards"]
    assert "tree / chain" in format_tree(report)


@pytest.mark.parametrize("args, fragment", [(["--bild-rollbacks", "x,1"], "--bild-rollbacks"),
                                            (["--tree-branch", "0"], "--tree-branch"),
                                            (["--draft", "/nonexistent"], "--draft"),
                                            (["--dllm", "ar:ar_target"], "--dllm")])
def test_bad_options_are_usage_errors(args, fragment):
    from click.testing import CliRunner

    from dllm_decode.cli import main

    result = CliRunner().invoke(main, ["bench", "tree", *args])
    assert result.exit_code == 2 and fragment in result.output


@pytest.mark.slow
def test_quick_run_prints_every_table(tmp_path):
    from click.testing import CliRunner

    from dllm_decode.cli import main

    out = tmp_path / "tree.json"
    result = CliRunner().invoke(main, ["bench", "tree", "--quick", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert list(report["ar"]) == ["compact"] and report["per_task"] == 1
    labels = [row["label"] for row in report["ar"]["compact"]["rows"]]
    assert labels[-2:] == ["BiLD fallback 0.6, exact", "BiLD fallback 0.6, rollback 2"]
    assert "self-spec of it, K=4" in result.output and "tree / chain" in result.output
