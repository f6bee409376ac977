"""The decode-order heatmaps of the evaluation report."""

from __future__ import annotations

import pytest

from dllm_decode.eval.harness.order_plots import file_name, order_matrix, order_panels, plot_order


def test_the_matrix_counts_the_share_of_samples():
    matrix = order_matrix([[1, 2, 3], [1, 1, 2]])
    assert matrix == [[1.0, 0.5, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 0.5]]
    assert all(abs(sum(row[p] for row in matrix) - 1.0) < 1e-12 for p in range(3))   # each column


def _record(task, key, finalized):
    return {"task": task, "config_key": key, "label": key, "finalized_at": finalized}


def test_panels_per_task_and_configuration_skip_unrecorded_samples(tmp_path):
    records = [_record("a/b", "k1", [1, 2]), _record("a/b", "k2", [1, 1]), _record("c", "k1", [2, 1]),
               {"task": "c", "config_key": "ar", "label": "ar", "finalized_at": None}]
    panels = order_panels(records)
    assert [label for label, _ in panels["a/b"]] == ["k1", "k2"] and len(panels["c"]) == 1
    assert file_name("a/b") == "order-a_b.png"
    pytest.importorskip("matplotlib")
    paths = plot_order(records, tmp_path)
    assert [p.name for p in paths] == ["order-a_b.png", "order-c.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
