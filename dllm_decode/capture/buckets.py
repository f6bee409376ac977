"""The static shapes a captured step is compiled or recorded for: batch rows, canvas width and
window width, each padded up to the next bucket (vLLM's capture sizes, SGLang's batch sizes).

A step of B rows over a canvas of L columns feeding W of them runs in the smallest bucket
(B', L', W') >= (B, L, W): padding rows are dummies that attend one column and hold no [MASK];
padding columns point at the scratch column L' (never attended, never eligible). One graph per
bucket is compiled or captured, once, on first use.
"""

from __future__ import annotations

from dataclasses import dataclass


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class Buckets:
    """Which shapes a captured step is built for.

    Attributes:
        max_batch: the largest batch bucket (the engine's maximum batch). Batch buckets are the
            powers of two up to it: 1, 2, 4, ..., max_batch.
        length_step: canvas widths are padded to a multiple of this (64: a prompt-length change
            of a few tokens reuses the graph).
        block_length: the decode's block length. Window widths are the block length times a
            power of two (the dual cache's in-block window, the logits window from the block
            start to the canvas end), or an exact width the caller names (`widths`).
        widths: extra exact window widths (the block plus a token-shifted model's one look-back
            row, so the dual cache's window is not padded to twice the block).
    """

    max_batch: int = 64
    length_step: int = 64
    block_length: int = 32
    widths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_batch", "length_step", "block_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def batches(self) -> tuple[int, ...]:
        """Every batch bucket, smallest first."""
        sizes, size = [], 1
        while size < self.max_batch:
            sizes.append(size)
            size *= 2
        return (*sizes, _next_power_of_two(self.max_batch))

    def batch(self, rows: int) -> int:
        """The batch bucket for `rows` rows (a power of two; past `max_batch` the next one,
        which compiles a graph of its own)."""
        return _next_power_of_two(rows)

    def length(self, columns: int) -> int:
        """The canvas bucket for `columns` columns (without the scratch column)."""
        return -(-columns // self.length_step) * self.length_step

    def width(self, columns: int, limit: int) -> int:
        """The window bucket for `columns` fed or returned columns, at most `limit` (the canvas
        bucket plus its scratch column)."""
        exact = [w for w in self.widths if w >= columns]
        size = self.block_length
        while size < columns:
            size *= 2
        return min([size, *exact, limit])
