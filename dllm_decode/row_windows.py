"""Each row's own block inside a step's shared window, for caches that keep per-row state
(`Cache.own_windows`).

A step runs one forward over the batch's window: every row's block together, from the earliest
block start to the latest block end. A row whose block starts later (a request that joined later
is still in an earlier block) would otherwise have the columns between recomputed, which its cache
alone would have kept as they are. `RowWindows` says what each row's own block is, and `keep`
turns a cache's own window per row into the columns a forward must leave as the row's cache holds
them (`models.layers.KVCache.keep`). A row whose block is done waits for the phase with nothing
recomputed, as it would have nothing to compute alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class RowWindows:
    """Host-side, one entry per batch row: its active block `[start, end)` (`start`: the first
    column it may commit in) and whether it still has work in this phase (`busy`)."""

    start: tuple[int, ...]
    end: tuple[int, ...]
    busy: tuple[bool, ...]

    @classmethod
    def of(cls, batch: Any, grid: int | None) -> RowWindows:
        """The rows of a `running.Batch` as they stand, each widened as `Batch.span` widens the
        shared window (to whole model blocks of a block-causal model of `grid`)."""
        b, starts = batch.bounds, batch.region_starts()
        spans = list(zip(starts, b.end)) if grid is None else \
            [b.grid_span(i, s, e, grid) for i, (s, e) in enumerate(zip(starts, b.end))]
        return cls(tuple(s for s, _ in spans), tuple(e for _, e in spans), tuple(bool(x) for x in b.busy))

    def keep(self, own: Callable[[tuple[int, int]], tuple[int, int]], length: int,
             device: torch.device, lookback: int = 0) -> Tensor | None:
        """(B, L) bool: the columns outside each row's own window `own((start, end))`, widened by
        the `lookback` columns a token-shifted model also feeds (a waiting row: every column), or
        None when no row has any (the common case: one window for all)."""
        windows = [(max(own((s, e))[0] - lookback, 0), own((s, e))[1]) if busy else (length, length)
                   for s, e, busy in zip(self.start, self.end, self.busy)]
        if len(set(windows)) == 1 and all(self.busy):
            return None
        bounds = torch.tensor(windows, dtype=torch.long).to(device, non_blocking=True)
        columns = torch.arange(length, device=device)
        return (columns < bounds[:, :1]) | (columns >= bounds[:, 1:])
