"""Data-parallel evaluation: 2 ranks merge to the same results as 1 process."""

from __future__ import annotations

import os
import socket

import pytest
import torch

from dllm_decode.eval.harness import distributed
from dllm_decode.eval.harness.grid import expand_grid
from dllm_decode.eval.harness.records import read_records
from dllm_decode.eval.harness.runner import SAMPLES, diffusion_decoder, evaluate
from dllm_decode.eval.tasks.sources import select_tasks
from dllm_decode.eval.harness.summary import summarize
from tests.eval.harness.answer_key import AnswerKeyModel

GEN = 8
TIMING = ("seconds",)


def _setup():
    runs, _ = select_tasks("copy,shuffle", limit=5)
    answers = {ex.prompt: (ex.answer if i % 2 else "bob") for run in runs
               for i, ex in enumerate(run.examples)}
    settings = expand_grid([("random", {})], {}, [("tokens_per_step", ["1", "4"])], gen_length=GEN)
    return AnswerKeyModel(answers, GEN), settings, runs


def _comparable(summary):
    return [{k: v for k, v in cell.items() if k not in TIMING} for cell in summary["results"]]


def _single(tmp_path):
    model, settings, runs = _setup()
    records = evaluate(diffusion_decoder(model), "key", settings, runs, tmp_path / "one", batch_size=2)
    return records


def test_two_ranks_in_turn_merge_to_the_one_process_result(tmp_path, monkeypatch):
    one = _single(tmp_path)
    model, settings, runs = _setup()
    out = tmp_path / "two"
    for rank in (1, 0):                 # rank 1 finishes first; the barrier is a no-op here
        monkeypatch.setattr(distributed, "rank_and_world", lambda rank=rank: (rank, 2))
        result = evaluate(diffusion_decoder(model), "key", settings, runs, out, batch_size=2)
        assert (result is None) == (rank == 1)
        if rank == 1:
            shard = read_records(out / "samples.rank1.jsonl")
            assert 0 < len(shard) < len(one)
    assert not list(out.glob("samples.rank*.jsonl"))     # merged and removed
    assert len(read_records(out / SAMPLES)) == len(one)
    assert _comparable(summarize(result)) == _comparable(summarize(one))


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    distributed.init_from_env()
    model, settings, runs = _setup()
    evaluate(diffusion_decoder(model), "key", settings, runs, out, batch_size=2)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_merge_to_the_one_process_result(tmp_path):
    one = _single(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "gloo"
    torch.multiprocessing.spawn(_worker, args=(2, port, str(out)), nprocs=2, join=True)
    merged = read_records(out / SAMPLES)
    assert len(merged) == len({r["key"] for r in merged}) == len(one)
    keys = [r["key"] for r in one]
    by_key = {r["key"]: r for r in merged}
    assert _comparable(summarize([by_key[k] for k in keys])) == _comparable(summarize(one))

