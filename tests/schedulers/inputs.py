"""Hand-written `StepInput`s: what the loop would hand a scheduler, built from logits or probabilities."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from dllm_decode.interfaces import StepInput
from dllm_decode.ops import masked_scores
from dllm_decode import step as steps


def step_input(logits: Tensor | None = None, *, probs: Tensor | None = None, masked: Tensor | None = None,
               block: list[tuple[int, int]] | None = None, offset: int = 0,
               gen_span: list[tuple[int, int]] | None = None, step: int = 0,
               num_steps: int | None = None, generator: torch.Generator | None = None) -> StepInput:
    """A (B, W, V) view at canvas columns [offset, offset + W).

    Give `logits` (probabilities are their softmax) or `probs` (logits are their log). Defaults:
    every column masked, the block and the generation region are the whole window.
    """
    block_t = torch.tensor(block) if block is not None else None
    span_t = torch.tensor(gen_span) if gen_span is not None else None
    return steps.step_input(logits=logits, probs=probs, is_masked=masked, block=block_t, gen_span=span_t,
                      offset=offset, step=step, num_steps=num_steps, generator=generator)


def with_confidence(confidence: list[list[float]] | Tensor, **kw) -> StepInput:
    """A view whose eligible confidences are exactly `confidence` (B, W) (tie and edge tests)."""
    conf = torch.as_tensor(confidence, dtype=torch.float32)
    probs = torch.full((*conf.shape, 4), 0.0)
    probs[..., 0] = 1.0
    inp = step_input(probs=probs, **kw)
    return dataclasses.replace(inp, confidence=masked_scores(conf, inp.eligible))


def rows(inp: StepInput, index: list[int]) -> StepInput:
    """The same view for a subset of batch rows."""
    take = torch.tensor(index)
    out = {}
    for f in dataclasses.fields(inp):
        value = getattr(inp, f.name)
        is_batched = isinstance(value, Tensor) and value.dim() and value.shape[0] == inp.live.shape[0]
        out[f.name] = value[take] if is_batched else value
    return dataclasses.replace(inp, **out)


def clone(inp: StepInput) -> StepInput:
    return dataclasses.replace(inp, **{f.name: getattr(inp, f.name).clone() for f in dataclasses.fields(inp)
                                       if isinstance(getattr(inp, f.name), Tensor)})


def same(a: StepInput, b: StepInput) -> bool:
    return all(torch.equal(getattr(a, f.name), getattr(b, f.name)) if isinstance(getattr(a, f.name), Tensor)
               else getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(a)
               if f.name != "generator")
