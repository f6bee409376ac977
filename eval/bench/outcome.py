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
    its forwards timed."""
    from dllm_decode.eval.bench.timing import forward_timer
    from dllm_decode.sampler import generate

    with forward_timer(model, sync) as spent:
        result = generate(model, chunk, config, **extra)
    return Outcome(spent[0], int(spent[1]), [int(n) for n in result.nfe.tolist()],
                   result.tokens[:, -config.gen_length:].tolist())
