"""`--tensor-parallel N` on the command line: sizes that do not fit are one-line usage errors
before any model loads; under `torchrun` decode and batch equal one process, rank 0 alone
prints and writes."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from tests.distributed.launching import torchrun

REQUESTS = [{"id": "a", "prompt": "w1 w2"}, {"id": "b", "prompt": "w5 w6 w7", "max_tokens": 4},
            {"id": "c", "prompt": "w9", "seed": 3, "temperature": 0.7}]
DECODE = ["--model", "tiny", "--gen-length", "8", "--block-length", "4"]


@pytest.mark.parametrize("command", [[], ["serve"], ["eval", "--out", "OUT"]])
@pytest.mark.parametrize("world, tp, fragment", [
    (None, 2, "this is a single process; launch with `torchrun --nproc_per_node 2"),
    ("3", 2, "does not divide the world size 3"),
])
def test_sizes_that_do_not_fit_are_usage_errors(tmp_path, monkeypatch, command, world, tp, fragment):
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    result = CliRunner().invoke(main, [*args, "--tensor-parallel", str(tp), *DECODE[:2],
                                       *(["--prompt", "w1"] if not command else [])])
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", [[], ["serve"]])
def test_one_group_commands_need_the_world_to_equal_the_size(monkeypatch, command):
    monkeypatch.setenv("WORLD_SIZE", "4")
    result = CliRunner().invoke(main, [*command, "--tensor-parallel", "2", *DECODE[:2],
                                       *(["--prompt", "w1"] if not command else [])])
    assert result.exit_code == 2
    assert "must equal the world size 4" in result.output and "data-parallel groups are for `eval`" \
        in result.output


def test_tensor_parallel_of_zero_is_refused():
    result = CliRunner().invoke(main, ["--tensor-parallel", "0", "--prompt", "w1"])
    assert result.exit_code == 2 and "0 is not in the range x>=1" in result.output


def _torchrun(args: list[str], cwd, done) -> subprocess.CompletedProcess:
    return torchrun(["--tensor-parallel", "2", *args], 2, cwd, done, timeout=300)


def _key(record: dict) -> tuple:
    return record["id"], record["text"], record["nfe"], record["finish_reason"]


def test_batch_under_two_ranks_writes_one_process_results_once(tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    one = CliRunner().invoke(main, [*DECODE, "--input", str(requests), "--output",
                                    str(tmp_path / "one.jsonl"), "--batch-size", "2"])
    assert one.exit_code == 0, one.output
    two = tmp_path / "two.jsonl"
    run = _torchrun([*DECODE, "--input", str(requests), "--output", str(two), "--batch-size", "2"],
                    tmp_path, lambda: two.is_file() and len(two.read_text().splitlines()) == 3)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count("3 request(s) written") == 1                # rank 0 alone reports
    read = lambda name: [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]  # noqa: E731
    assert sorted(map(_key, read("two.jsonl"))) == sorted(map(_key, read("one.jsonl")))
    assert len(read("two.jsonl")) == 3


@pytest.mark.slow
def test_decode_under_two_ranks_prints_the_one_process_answer_once(tmp_path):
    one = CliRunner().invoke(main, [*DECODE, "--prompt", "w1 w2 w3", "--json"])
    run = _torchrun([*DECODE, "--prompt", "w1 w2 w3", "--json"], tmp_path, lambda: False)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1
    drop = lambda r: {k: v for k, v in r.items() if k != "seconds"}  # noqa: E731
    assert drop(json.loads(lines[0])) == drop(json.loads(one.output))
