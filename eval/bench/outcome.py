"""One timed decode of a batch, whoever's loop ran it: this project's (`ours`) or a peer's
(`dllm_decode.eval.bench.peers`), so `bench shaped` compares them row by row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """One timed decode of a batch: seconds inside model forwards (None where the loop is not
    ours to time), forwards, NFE per sample, generated tokens per sample."""

    forward_seconds: float | None
    forwards: int
    nfe: list[int]
    tokens: list[list[int]]


def ours(model: Any, chunk: list[list[int]], config: Any, sync: Callable[[], None] | None,
         **extra: Any) -> Outcome:
    """This project's loop (`generate`, with `extra` keywords such as `capture`) on one batch,
    its forwards timed (where they go through `model.forward`; a captured step's do not, and its
    forwards are then its steps: every row of a batch steps together)."""
    from dllm_decode.eval.bench.timing import forward_timer
    from dllm_decode.sampler import generate

    with forward_timer(model, sync) as spent:
        result = generate(model, chunk, config, **extra)
    nfe = [int(n) for n in result.nfe.tolist()]
    if not spent[1]:         # a captured step runs the blocks without model.forward: count steps
        return Outcome(None, max(nfe), nfe, result.tokens[:, -config.gen_length:].tolist())
    return Outcome(spent[0], int(spent[1]), nfe, result.tokens[:, -config.gen_length:].tolist())
