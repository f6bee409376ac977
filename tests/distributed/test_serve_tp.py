"""`torchrun --nproc_per_node 2 -m dllm_decode serve --tensor-parallel 2`: rank 0 answers HTTP,
rank 1 follows its engine; concurrent clients get the answers offline `generate` gives (0 lost),
and SIGTERM to the server (rank 0) ends both ranks cleanly (torchrun exits 0)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.serve.conftest import post, wait_until

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

GEN, BLOCK = 8, 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _requests(count: int) -> list[dict]:
    words = [f"w{i}" for i in range(1, 30)]
    return [{"model": "tiny", "prompt": " ".join(words[i % 7:i % 7 + 2 + i % 4]), "seed": i,
             "temperature": 0.0 if i % 3 else 0.8, "max_tokens": GEN} for i in range(count)]


def _offline(bodies: list[dict]) -> list[str]:
    from dllm_decode import DecodeConfig, generate
    from dllm_decode.testing import tiny_llada_with_tokenizer

    model = tiny_llada_with_tokenizer()
    out = []
    for body in bodies:
        config = DecodeConfig.from_dict({"scheduler": "threshold", "gen_length": GEN,
                                         "block_length": BLOCK, "seed": body["seed"],
                                         "temperature": body["temperature"]})
        out.append(generate(model, [body["prompt"]], config).text[0])
    return out


def _rank_zero(launcher: int) -> int:
    """The pid of the launcher's child with RANK=0."""
    children = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True)
    for pid in map(int, children.stdout.split()):
        with open(f"/proc/{pid}/environ", "rb") as handle:
            if b"RANK=0" in handle.read().split(b"\0"):
                return pid
    raise AssertionError(f"no rank-0 child of {launcher}")


def two_rank_server(*options: str) -> tuple[str, subprocess.Popen]:
    """`torchrun --nproc_per_node 2 -m dllm_decode serve --tensor-parallel 2 OPTIONS` on a free
    port, once /health answers: (its URL, the launcher)."""
    port, rendezvous = _free_port(), _free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
         str(rendezvous), "-m", "dllm_decode", "serve", "--tensor-parallel", "2", "--port", str(port),
         "--threads", "1", "--log-level", "warning", *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TORCHELASTIC_ERROR_FILE": os.devnull})

    def up() -> bool:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False
    if not wait_until(up, timeout=180):
        log = process.stdout.read1().decode() if process.poll() is not None else "no answer"
        process.kill()
        process.wait()
        raise AssertionError(log)
    return url, process


def _serve_and_ask(clients: int) -> None:
    url, process = two_rank_server("--model", "tiny", "--gen-length", str(GEN), "--block-length", str(BLOCK),
                                   "--max-concurrent", "8", "--max-queue", "64")
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            assert json.loads(response.read())["tensor_parallel"] == 2
        bodies = _requests(clients)
        with ThreadPoolExecutor(clients) as pool:
            answers = list(pool.map(lambda b: post(url, "/v1/completions", b, timeout=120), bodies))
        assert [status for status, _ in answers] == [200] * clients            # 0 lost
        texts = [body["choices"][0]["text"] for _, body in answers]
        assert texts == _offline(bodies)
        started = time.monotonic()
        os.kill(_rank_zero(process.pid), signal.SIGTERM)    # the server: it stops the followers
        code = process.wait(timeout=90)
        log = process.stdout.read().decode()
        assert code == 0, log[-3000:]
        assert time.monotonic() - started < 60
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_two_rank_server_answers_like_offline_generate():
    _serve_and_ask(8)


@pytest.mark.slow
def test_two_rank_server_answers_64_concurrent_clients():
    _serve_and_ask(64)
