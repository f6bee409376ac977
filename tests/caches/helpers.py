"""What the tests of the adaptive and suffix-pruning caches share: decodes, comparisons, prompts."""

from __future__ import annotations

import dataclasses

import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import ThresholdScheduler
from dllm_decode.testing import assert_probabilities_close

MASK, EOS = 36, 35
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]       # left padding: three prompt lengths
TASK_PROMPTS = ["sort : mia ella hank", "latin : Y L 3 X", "reverse : lucy eric kevin carl"]


def config(scheduler=None, gen=16, block=8, **kw) -> DecodeConfig:
    return DecodeConfig(scheduler=scheduler or ThresholdScheduler(), gen_length=gen,
                        block_length=block, **kw)


def decode(model, cache, prompts=PROMPTS, cfg=None, **kw):
    return generate(model, prompts, dataclasses.replace(cfg or config(), cache=cache), trace=True, **kw)


def assert_same_decode(result, reference) -> None:
    """Same tokens, NFE, window offsets and, step by step, the same confidences (to rounding)."""
    assert torch.equal(result.tokens, reference.tokens)
    assert torch.equal(result.nfe, reference.nfe)
    assert len(result.trace) == len(reference.trace)
    for step, ref in zip(result.trace, reference.trace):
        assert step["offset"] == ref["offset"]
        assert_probabilities_close(step["confidence"], ref["confidence"])


def assert_batched_equals_alone(model, cache, prompts, cfg) -> None:
    batched = generate(model, prompts, dataclasses.replace(cfg, cache=cache))
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], dataclasses.replace(cfg, cache=cache))
        assert torch.equal(batched.tokens[row], alone.tokens[0]), row
        assert batched.nfe[row] == alone.nfe[0]


def counts(result, key: str) -> list[list[int]]:
    """Per step, the cache's per-row count `key` from the trace."""
    return [step["cache"][key].tolist() for step in result.trace]
