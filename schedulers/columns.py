"""Per-position state keyed by absolute canvas column, carried from one step's columns to the next.

The loop's window moves (a new block, a finished row dropped, a wider view under a wrapper), so a
scheduler that remembers something per position stores it with the canvas column of its first
entry and realigns it each step: a position keeps its memory for as long as it stays in view.
"""

from __future__ import annotations

import torch
from torch import Tensor


def carry(values: Tensor, start: Tensor, columns: Tensor, fill: float | int) -> Tensor:
    """Realign per-position values to new canvas columns.

    Args:
        values: (B, K, ...) entries for canvas columns `start[b] + k`.
        start: (B,) long canvas column of each row's entry 0.
        columns: (B, K') long canvas columns wanted.
        fill: value for wanted columns that `values` does not cover.
    Returns:
        (B, K', ...) values at `columns`, `fill` where unknown.
    """
    trailing = values.shape[2:]
    out_shape = (*columns.shape, *trailing)
    if values.shape[1] == 0:
        return torch.full(out_shape, fill, dtype=values.dtype, device=values.device)
    index = columns - start.unsqueeze(-1)
    known = (index >= 0) & (index < values.shape[1])
    index = index.clamp(0, values.shape[1] - 1)
    index = index.reshape(*index.shape, *(1,) * len(trailing)).expand(out_shape)
    gathered = values.gather(1, index)
    known = known.reshape(*known.shape, *(1,) * len(trailing))
    return torch.where(known, gathered, torch.full((), fill, dtype=values.dtype, device=values.device))
