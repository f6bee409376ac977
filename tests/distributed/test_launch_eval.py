"""`torchrun -m dllm_decode eval --tensor-parallel T` on T x D processes: D data-parallel groups of
T ranks; prompts are sharded by group, only each group's TP rank 0 writes, and the merged samples
equal a one-process run."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from tests.distributed.launching import torchrun

EVAL = ["eval", "--model", "tiny", "--tasks", "copy,sort", "--limit", "3", "--gen-length", "8",
        "--block-length", "4", "--batch-size", "2", "--scheduler", "threshold",
        "--sweep", "threshold=0.9,0.3", "--no-plots", "--no-progress", "--json"]
TIMING = {"seconds"}


def _samples(directory) -> dict[str, dict]:
    lines = (directory / "samples.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {r["key"]: {k: v for k, v in r.items() if k not in TIMING} for r in records}


def _run(world: int, tp: int, out) -> subprocess.CompletedProcess:
    return torchrun([*EVAL, "--tensor-parallel", str(tp), "--out", str(out)], world, out.parent,
                    lambda: (out / "summary.json").is_file())


def _check(tmp_path, world: int, tp: int) -> None:
    one = CliRunner().invoke(main, [*EVAL, "--out", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    run = _run(world, tp, tmp_path / "many")
    assert run.returncode == 0, run.stderr[-3000:]
    summaries = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1                                     # global rank 0 reports
    assert not list((tmp_path / "many").glob("samples.rank*.jsonl"))
    expected, merged = _samples(tmp_path / "one"), _samples(tmp_path / "many")
    assert len(expected) == 12 and merged == expected


def test_one_tensor_parallel_group_evaluates_like_one_process(tmp_path):
    _check(tmp_path, world=2, tp=2)


@pytest.mark.slow
def test_two_data_parallel_groups_of_two_ranks_merge_to_the_one_process_result(tmp_path):
    _check(tmp_path, world=4, tp=2)
