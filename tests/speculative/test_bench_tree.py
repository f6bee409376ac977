"""The side-by-side benchmark of trees, staged, BiLD and self-speculation (no timing assertions)."""

from __future__ import annotations

import pytest

from dllm_decode.speculative import TreeShape


@pytest.mark.slow
def test_run_reports_every_family_and_exact_ones_are_identical():
    from dllm_decode.eval.bench.spec_tree import run

    lines: list[str] = []
    report = run(per_task=1, repeats=1, runtimes=("compact",), tree=TreeShape(3, 8),
                 bild_rollbacks=(None, 3.0), self_per_task=1, self_repeats=1, draft_steps=4,
                 log=lines.append)
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
    assert any("tree / chain" in line for line in lines)


@pytest.mark.parametrize("args, fragment", [(["--bild-rollbacks", "x,1"], "--bild-rollbacks"),
                                            (["--tree-branch", "0"], "--tree-branch")])
def test_bad_options_are_usage_errors(args, fragment):
    from click.testing import CliRunner

    from dllm_decode.cli import main

    result = CliRunner().invoke(main, ["bench", "tree", *args])
    assert result.exit_code == 2 and fragment in result.output
