"""Uniform draws a row gets whether it decodes alone or in a batch.

A request's one generator serves all its rows, so drawing (B, ...) values from it gives a row
draws that depend on how many rows share the call. These draws instead mix one draw of the
generator per call (the same alone and in a batch: one per request) with a hash of the row's
own state: each column's place in the generation and the tokens of the row's block. No host
sync.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dllm_decode.interfaces import StepInput


def _mix(x: Tensor) -> Tensor:
    """A 32-bit integer hash (two rounds of xor-shift-multiply), elementwise on int64."""
    for _ in range(2):
        x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def row_uniform(inp: StepInput, n: int) -> Tensor:
    """(B, n, W) float64 U(0, 1) draws (never 0 or 1) for the window's columns, n per column,
    from one draw of `inp.generator` and each row's own state."""
    key = torch.randint(0, 2 ** 31 - 1, (1,), generator=inp.generator, device=inp.live.device)
    relative = inp.columns.unsqueeze(0) - inp.gen_span[:, :1]                          # (B, W)
    inside = (inp.columns >= inp.block[:, :1]) & (inp.columns < inp.block[:, 1:])
    current = inp.current if inp.current is not None else inp.candidates
    content = _mix(torch.where(inside, (current + 1) * (relative + 7), 0).sum(-1) & 0x7FFFFFFF)
    seed = _mix(key + content.unsqueeze(-1) * 31 + relative.clamp_min(0) * 1_000_003)  # (B, W)
    c = torch.arange(1, n + 1, device=seed.device).view(1, n, 1)
    bits = _mix(seed.unsqueeze(1) ^ (c * 0x27D4EB2D))
    return (bits.double() + 0.5) / 2.0 ** 32
