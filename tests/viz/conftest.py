"""A traced decode of the embedded model, shared by the view tests."""

from __future__ import annotations

import os

import pytest

PROMPTS = ["sort: 5 3 9 1", "sort: 8 2 7"]


@pytest.fixture(scope="session")
def traced(embedded):
    """(result, tokenizer): two prompts decoded side by side with `trace=True` (threshold 0.9)."""
    import torch

    from dllm_decode.config import DecodeConfig
    from dllm_decode.sampler import generate

    config = DecodeConfig.from_dict({"scheduler": {"name": "threshold", "threshold": 0.9},
                                     "gen_length": 16, "block_length": 8})
    result = generate(embedded, PROMPTS, config, tokenizer=embedded.tokenizer, trace=True,
                      generator=torch.Generator().manual_seed(0))
    return result, embedded.tokenizer


def read_screen(leader: int) -> str:
    """Everything written to a pseudo-terminal until its last writer closes (then closes it)."""
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:                  # EIO: the other side is closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace")
