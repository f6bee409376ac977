"""The canvas rows of a running batch and their bounds: the records `dllm_decode.running` keeps.

`Rows` holds the tensors of every row still decoding (all requests together); `Bounds` holds
their host-side bounds. Rows are laid out right-aligned:
each row is `[padding][prompt][generation]` with its own generation start, so rows of different
lengths share one canvas, and a request that joins between blocks only pads the others on the
left (which no row attends, and which no cache keeps across a block start).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Rows:
    """Tensors of the rows still decoding (every request's, in batch order)."""

    x: Tensor                        # (b, L) canvas
    attention_mask: Tensor | None    # (b, L), None while no row is padded or truncated
    slot: Tensor                     # (b,) the row's index inside its request
    revisions: Tensor | None = None  # (b, L) times each column was re-masked or edited

    def keep(self, kept: Tensor) -> Rows:
        mask = None if self.attention_mask is None else self.attention_mask[kept]
        revisions = None if self.revisions is None else self.revisions[kept]
        return Rows(self.x[kept], mask, self.slot[kept], revisions)

    def trim(self, width: int) -> Rows:
        """Keep the first `width` canvas columns."""
        mask = None if self.attention_mask is None else self.attention_mask[:, :width]
        revisions = None if self.revisions is None else self.revisions[:, :width]
        return Rows(self.x[:, :width], mask, self.slot, revisions)

    def append(self, x: Tensor, attention_mask: Tensor | None, slot: Tensor, revisions: bool,
               pad_id: int) -> Rows:
        """These rows plus new ones, both right-aligned to the wider of the two canvases (the
        narrower side gains left padding: token `pad_id`, attention 0)."""
        width = max(self.x.shape[1], x.shape[1])
        old_mask = self.attention_mask if self.attention_mask is not None else torch.ones_like(self.x)
        attention_mask = attention_mask if attention_mask is not None else torch.ones_like(x)
        own = [_pad_left(t, width, v) for t, v in ((self.x, pad_id), (old_mask, 0))]
        new = [_pad_left(t, width, v) for t, v in ((x, pad_id), (attention_mask, 0))]
        counts = None
        if revisions:
            before = self.revisions if self.revisions is not None else torch.zeros_like(self.x, dtype=torch.int32)
            counts = torch.cat([_pad_left(before, width, 0), torch.zeros_like(new[0], dtype=torch.int32)])
        return Rows(torch.cat([own[0], new[0]]), torch.cat([own[1], new[1]]),
                    torch.cat([self.slot, slot]), counts)


def _pad_left(t: Tensor, width: int, value: Any) -> Tensor:
    if t.shape[1] == width:
        return t
    pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t], dim=1)


@dataclass
class Bounds:
    """Host-side bounds of the rows still decoding, one entry per row, in batch order.

    Attributes:
        request: the row's request (index into `Batch.members`).
        gen_start, gen_end: its generation region (`gen_end` shrinks under truncation).
        prompt_length: its prompt's tokens, i.e. the position of its first generated column
            (positions count real tokens from the row's first one).
        start, end: its active block.
        post: edit passes it made after its block was full.
        revising: it runs another edit pass before its block is done.
        busy: it still has work in this phase (masks in its block, or an edit pass to run).
    """

    request: list[int] = field(default_factory=list)
    prompt_length: list[int] = field(default_factory=list)
    gen_start: list[int] = field(default_factory=list)
    gen_end: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    post: list[int] = field(default_factory=list)
    revising: list[bool] = field(default_factory=list)
    busy: list[bool] = field(default_factory=list)

    FIELDS = ("request", "prompt_length", "gen_start", "gen_end", "start", "end", "post", "revising",
              "busy")

    def __len__(self) -> int:
        return len(self.request)

    def advance(self, block_lengths: list[int], grid: bool = False) -> None:
        """Every row moves on to its next block (`block_lengths`: each row's request's).

        `grid`: blocks lie on the position grid anchored at each row's first token (multiples of
        the block length in positions), as block-diffusion models are trained: a row's first
        block then completes the prompt's last, partial block. Otherwise (semi-autoregressive
        LLaDA blocks) blocks are counted from the generation start.
        """
        self.start = list(self.end)
        ends = []
        for i, (s, b, g) in enumerate(zip(self.start, block_lengths, self.gen_end)):
            into = self.position(i, s) % b if grid else 0
            ends.append(min(s + b - into, g))
        self.end = ends
        self.post = [0] * len(self)
        self.revising = [False] * len(self)
        self.busy = [True] * len(self)

    def keep(self, kept: list[int]) -> Bounds:
        return Bounds(*([getattr(self, name)[i] for i in kept] for name in self.FIELDS))

    def position(self, row: int, column: int) -> int:
        """The position (real tokens before it) of a canvas column of a row's generation region."""
        return self.prompt_length[row] + column - self.gen_start[row]

    def grid_span(self, row: int, start: int, end: int, size: int) -> tuple[int, int]:
        """Canvas columns of the `size`-blocks of the position grid that cover `[start, end)`."""
        first = start - self.position(row, start) % size
        last = end - 1
        return first, min(last - self.position(row, last) % size + size, self.gen_end[row])

    def shift(self, by: int) -> None:
        """Every column moves `by` to the right (the canvas gained left padding)."""
        for name in ("gen_start", "gen_end", "start", "end"):
            setattr(self, name, [v + by for v in getattr(self, name)])

    def extend(self, other: Bounds) -> None:
        for name in self.FIELDS:
            getattr(self, name).extend(getattr(other, name))

    def budget(self, rows: list[int]) -> int:
        """Step budget of these rows' current blocks, fixed when the bounds are set: a truncation
        inside a block shrinks the block but not the budget, so fixed-step schedules keep their
        per-step counts (and the step cap cannot fire on steps already taken)."""
        return max(self.end[r] - self.start[r] for r in rows)
