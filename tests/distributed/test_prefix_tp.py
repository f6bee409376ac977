"""The prefix cache under tensor parallelism: `torchrun --nproc_per_node 2 -m dllm_decode serve
--tensor-parallel 2 --prefix-cache-bytes N` on the shipped block-diffusion model. Each rank keeps
its own store of its head shard; requests sharing a system prompt reuse it (cached tokens in the
replies, hits in /metrics) and every answer equals offline `generate` in one process."""

from __future__ import annotations

import os
import signal
import urllib.request

import pytest
import torch

from tests.distributed.test_serve_tp import _rank_zero, two_rank_server
from tests.serve.conftest import post

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

GEN, BLOCK = 16, 8


def _bodies() -> list[dict]:
    system = list(range(5, 45))                      # 40 tokens: 5 whole blocks of embedded-bd
    return [{"model": "embedded-bd", "prompt": system + [50 + i, 60 + i, 70 + i]} for i in range(6)]


def _offline(bodies: list[dict]) -> list[str]:
    from dllm_decode import DecodeConfig, generate
    from dllm_decode.models.loading import load_model

    model = load_model("embedded-bd", dtype=torch.float32)
    config = DecodeConfig.from_dict({"scheduler": "threshold", "cache": "block", "gen_length": GEN,
                                     "block_length": BLOCK})
    return [generate(model, [body["prompt"]], config).text[0] for body in bodies]


@pytest.mark.slow
def test_two_ranks_share_prefixes_and_answer_like_offline_generate():
    url, process = two_rank_server(
        "--model", "embedded-bd", "--dtype", "float32", "--gen-length", str(GEN), "--block-length", str(BLOCK),
        "--cache", "block", "--scheduler", "threshold", "--max-concurrent", "2", "--prefix-cache-bytes", str(1 << 24))
    try:
        bodies = _bodies()
        answers = [post(url, "/v1/completions", body, timeout=120) for body in bodies]   # in order
        assert [status for status, _ in answers] == [200] * len(bodies)
        assert [body["choices"][0]["text"] for _, body in answers] == _offline(bodies)
        cached = [body["usage"]["prompt_tokens_details"]["cached_tokens"] for _, body in answers]
        assert cached[0] == 0 and all(c == 40 for c in cached[1:]), cached
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert f"dllm_prefix_cache_hits_total {len(bodies) - 1}" in metrics
        os.kill(_rank_zero(process.pid), signal.SIGTERM)
        assert process.wait(timeout=90) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
