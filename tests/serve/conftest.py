"""A live server on 127.0.0.1 (random free port) around the embedded model (the `embedded`
fixture of tests/conftest.py), and raw HTTP helpers."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
import torch

def default_config(**fields):
    from dllm_decode.config import DecodeConfig
    from dllm_decode.registry import component

    fields = {"scheduler": component("scheduler", "threshold"), "gen_length": 32, "block_length": 8,
              **fields}
    return DecodeConfig(**fields)


def make_state(model, *, max_batch_size=4, config=None, **limits):
    from dllm_decode.engine import Engine
    from dllm_decode.serve.app import Limits, ServerState
    from dllm_decode.serve.protocol import Settings
    from dllm_decode.serve.worker import EngineWorker

    settings = Settings(model_id="embedded", config=config or default_config(), max_tokens=256)
    engine = Engine(model, max_batch_size=max_batch_size)
    return ServerState(EngineWorker(engine, threads=1), settings, Limits(**limits))


@pytest.fixture(scope="module")
def server(embedded):
    """(base URL, state) of a server shared by a module's tests."""
    from dllm_decode.serve.app import background

    state = make_state(embedded)
    with background(state) as url:
        yield url, state


class Slow(torch.nn.Module):
    """A model that sleeps `delay` seconds per forward (room for timeouts, disconnects, queues)."""

    def __init__(self, model, delay: float = 0.05):
        super().__init__()
        self.inner, self.delay = model, delay
        for name in ("mask_token_id", "eos_token_ids", "vocab_size", "max_length", "tokenizer"):
            setattr(self, name, getattr(model, name))

    def forward(self, *args, **kwargs):
        time.sleep(self.delay)
        return self.inner(*args, **kwargs)


def post(url: str, path: str, body, timeout: float = 60.0) -> tuple[int, dict]:
    """POST raw bytes (or JSON-encoded `body`); returns (status, decoded JSON body)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def sse(url: str, path: str, body: dict, timeout: float = 60.0) -> list:
    """The `data:` payloads of a streamed reply, in order (`[DONE]` as the string)."""
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = [e for e in raw.split("\n\n") if e.strip()]
    assert raw.endswith("\n\n") and all(e.startswith("data: ") for e in events)
    return [e[6:] if e[6:] == "[DONE]" else json.loads(e[6:]) for e in events]


def wait_until(condition, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()
