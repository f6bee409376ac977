"""DiffusionGemma's encoder prefix cache under tensor parallelism: two gloo ranks each run an
`Engine` with the prefix cache over a sharded tiny DiffusionGemma. Each rank keeps its own store
of its head shard, reuses the same prompt tokens, and every
request's tokens equal one process without the cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Engine, Request
from dllm_decode.testing import tiny_diffusion_gemma
from tests.distributed.launching import free_port, spawn

SYSTEM = tuple(range(5, 30))            # 25 tokens: 3 whole chunks of 8


def _serve(model, budget: int) -> dict:
    config = DecodeConfig.for_model(model, 16)
    engine = Engine(model, max_batch_size=2, prefix_cache_bytes=budget)
    for i in range(4):
        engine.add(Request(str(i), SYSTEM + (40 + i, 50 + i, 60 + i), config))
    out = {}
    while engine.has_work:
        out.update({u.request_id: u.output for u in engine.step() if u.output is not None})
    stats = engine.prefix.stats().to_dict() if engine.prefix is not None else {}
    return {"tokens": {k: list(v.tokens) for k, v in out.items()},
            "cached": {k: v.cached_tokens for k, v in out.items()}, "stats": stats}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from dllm_decode.parallel import init_parallel, shutdown_parallel
    from dllm_decode.parallel.diffusion_gemma import shard_diffusion_gemma

    try:
        groups = init_parallel(world)
        model = shard_diffusion_gemma(tiny_diffusion_gemma(seed=0, steps=4), groups, experts="expert")
        Path(out, f"rank{rank}.json").write_text(json.dumps(_serve(model, 1 << 24)))
    finally:
        shutdown_parallel()


def test_each_rank_keeps_its_own_shard_and_tokens_equal_one_process(tmp_path):
    spawn(_worker, (2, free_port(), str(tmp_path)), 2, tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    one = _serve(tiny_diffusion_gemma(seed=0, steps=4), 1 << 24)
    plain = _serve(tiny_diffusion_gemma(seed=0, steps=4), 0)
    assert all(r["tokens"] == plain["tokens"] for r in ranks)
    assert all(r["cached"] == one["cached"] for r in ranks) and sum(one["cached"].values()) == 3 * 24
    assert ranks[0]["stats"] == ranks[1]["stats"] and ranks[0]["stats"]["entries"] == one["stats"]["entries"]
    # a rank stores its shard: the sliding layer's 2 KV heads split, the full layer's 1 replicated
    assert ranks[0]["stats"]["resident_bytes"] * 4 == one["stats"]["resident_bytes"] * 3
