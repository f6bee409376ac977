"""`dllm-decode bench tp`: the paper model's arithmetic by hand, its collective plan against the
counter on two gloo ranks (`--quick`), and the one-process form."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.eval.bench.tp import LINKS, SHAPES, Step, collectives, paper_table, predict
from tests.distributed.launching import torchrun


def test_shapes_have_the_model_cards_sizes():
    assert round(SHAPES["llada-8b"].total_params() / 1e9, 1) == 8.0
    flash = SHAPES["llada2-flash"]
    assert 100 <= flash.total_params() / 1e9 <= 105 and 5 <= flash.active_params() / 1e9 <= 6.5


def test_collectives_of_a_step_by_hand():
    step = Step(batch=16, rows=32, window=32, keys=320)
    ops = collectives(SHAPES["llada-8b"], step, 2)
    reduces = [size for op, size in ops if op == "all_reduce"]
    assert len(reduces) == 2 * 32 + 1 and set(reduces) == {16 * 32 * 4096 * 2}   # bf16 (B·rows, d)
    assert ops[-1] == ("all_gather_into_tensor", 16 * 32 * (126464 // 2) * 2)
    moe = collectives(SHAPES["llada2-flash"], step, 2)
    assert sum(size == 16 * 32 * 4096 * 4 for _, size in moe) == 31              # fp32 MoE reduces
    assert collectives(SHAPES["llada-8b"], step, 1) == []


def test_the_model_is_consistent_and_answers_the_issues_prediction():
    dual, full = Step(16, 32, 32, 320), Step(16, 288, 32, 288)
    shape = SHAPES["llada-8b"]
    nvlink = predict(shape, dual, 2, LINKS["nvlink"])
    assert predict(shape, dual, 2, LINKS["pcie"]).speedup < nvlink.speedup < 2
    assert nvlink.step_ms == pytest.approx(max(nvlink.compute_ms, nvlink.weights_ms) + nvlink.comm_ms)
    # TP=2 >= 1.6x for LLaDA-8B at batch 16 on NVLink: holds for the full-canvas step, not for a
    # dual-cache step of 32 rows (latency-bound all-reduces of 4 MB)
    assert predict(shape, full, 2, LINKS["nvlink"]).speedup >= 1.6 > nvlink.speedup
    rows = paper_table(sizes=(2, 4))
    assert len(rows) == 2 * 2 * 3 * 2 * 2 and all(0 < r.efficiency <= 1 for r in rows)


def test_one_process_prints_the_paper_table_or_says_how_to_measure(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    paper = CliRunner().invoke(main, ["bench", "tp", "--paper"])
    assert paper.exit_code == 0 and "| LLaDA2-flash | 32 | 16 | 8 | 65 |" in paper.output
    alone = CliRunner().invoke(main, ["bench", "tp", "--quick"])
    assert alone.exit_code == 0 and "torchrun --nproc_per_node N" in alone.output


def test_quick_under_two_gloo_ranks_counts_what_the_model_plans(tmp_path):
    run = torchrun(["bench", "tp", "--quick", "--json", str(tmp_path / "r.json")], 2, tmp_path,
                   lambda: (tmp_path / "r.json").is_file(), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["tp"] == 2 and report["measured"] == report["planned"]
    assert report["measured"]["counts"] == {"all_reduce": 2 * 4 + 1, "all_gather_into_tensor": 1}
    assert report["one_gpu_ms"] > 0 and report["tp_ms"] > 0
    assert run.stdout.count("collectives per forward, measured") == 1
