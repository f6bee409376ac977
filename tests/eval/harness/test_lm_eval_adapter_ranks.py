"""The lm-eval adapter under a launcher: it reports its rank and world size, so lm-eval gives each
process its share of the documents (every world_size-th from its rank, lm-eval's
`doc_iterator` rule) and the union of the shares is every request exactly once."""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dllm_decode.eval.harness.lm_eval_adapter import DllmDecodeLM
from tests.distributed.launching import free_port, spawn
from tests.eval.harness.answer_key import AnswerKeyModel

KEY = {f"copy : {a} {b}": f"{a} {b}" for a, b in itertools.permutations(
    ["alice", "bob", "carol", "dan"], 2)}                 # 12 documents
PROMPTS = sorted(KEY)


@dataclass
class Request:
    args: tuple


def _lm() -> DllmDecodeLM:
    return DllmDecodeLM(model=AnswerKeyModel(KEY, 4), gen_length=4, batch_size=3)


def test_one_process_is_rank_0_of_1_without_a_launcher(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    lm = _lm()
    assert (lm.rank, lm.world_size) == (0, 1)
    assert not hasattr(lm, "accelerator") and lm.device == torch.device("cpu")


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        lm = _lm()                                       # joins the group the environment names
        mine = list(itertools.islice(range(len(PROMPTS)), lm.rank, None, lm.world_size))
        outputs = lm.generate_until([Request((PROMPTS[i], {"until": ["\n"]})) for i in mine])
        counts = lm.accelerator.gather(torch.tensor(len(mine))).tolist()
        lm.accelerator.wait_for_everyone()
        Path(out, f"rank{rank}.json").write_text(json.dumps({
            "rank": lm.rank, "world": lm.world_size, "docs": mine, "outputs": outputs,
            "counts": counts}))
    finally:
        torch.distributed.destroy_process_group()


def test_two_gloo_processes_cover_every_request_once(tmp_path):
    spawn(_worker, (2, free_port(), str(tmp_path)), 2, tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    docs = [d for r in ranks for d in r["docs"]]
    assert sorted(docs) == list(range(len(PROMPTS)))                    # each once
    assert ranks[0]["counts"] == ranks[1]["counts"] == [6, 6]
    single = _lm().generate_until([Request((p, {"until": ["\n"]})) for p in PROMPTS])
    merged = {d: o for r in ranks for d, o in zip(r["docs"], r["outputs"])}
    assert [merged[i] for i in range(len(PROMPTS))] == single == [KEY[p] for p in PROMPTS]
