"""A traced decode of the embedded model, shared by the view tests."""

from __future__ import annotations

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
