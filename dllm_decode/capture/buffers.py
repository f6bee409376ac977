"""`StepBuffers`: every tensor that crosses a captured step's boundary, allocated once per
(batch, canvas) bucket and updated in place (`copy_`), so its address never changes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.models.layers import StaticKVCache


@dataclass
class StepBuffers:
    """The static inputs of one (B, L) bucket; column L of each canvas-wide buffer is scratch.

    Attributes:
        canvas: (B, L + 1) long tokens (padding and scratch hold `pad_id`).
        attention: (B, L + 1) long, 1 for attended columns; 0 at padding and scratch. A dummy
            row (batch padding) attends its column 0 only, so its softmax is never empty.
        kv: the static K/V store, (layers, B, Hkv, L + 1, D) keys and values.
        windows: per window width W, the (W,) long fed canvas columns, the (O,) long fed-row
            index of each returned logits row and of its predecessor (token-shifted models),
            keyed ("fed", W) / ("out", O) / ("prev", O); and the named buffers of `static`.
        layout: what `allocate` was given for the K/V (heads, head_dim, dtype, device, store), so
            a bucket of other sizes can be made like this one.
    """

    canvas: Tensor
    attention: Tensor
    kv: StaticKVCache
    pad_id: int = 0
    windows: dict[tuple[str, int], Tensor] = field(default_factory=dict)

    layout: tuple = ()

    @classmethod
    def allocate(cls, batch: int, length: int, layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, store: Any = None, *,
                 pad_id: int) -> "StepBuffers":
        """Zeroed buffers; K/V of `dtype`, kept as `store` packs them (None: float)."""
        shape = (layers, batch, kv_heads, length + 1, head_dim)
        canvas = torch.full((batch, length + 1), pad_id, dtype=torch.long, device=device)
        return cls(canvas, torch.zeros_like(canvas), StaticKVCache.allocate(shape, dtype, device, store),
                   pad_id=pad_id, layout=(kv_heads, head_dim, dtype, device, store))

    @property
    def batch(self) -> int:
        return self.canvas.shape[0]

    @property
    def length(self) -> int:
        """The bucket's canvas width, without the scratch column."""
        return self.canvas.shape[1] - 1

    def index(self, kind: str, width: int) -> Tensor:
        """The static (width,) index buffer of `kind` ("fed", "out" or "prev")."""
        key = (kind, width)
        if key not in self.windows:
            self.windows[key] = torch.zeros(width, dtype=torch.long, device=self.canvas.device)
        return self.windows[key]

    def static(self, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.long) -> Tensor:
        """A named buffer of `shape` kept with the bucket (a fused step's block bounds, step
        counters, end-of-text ids, sampling noise): created once, then written in place."""
        key = (name, *shape, dtype)
        if key not in self.windows:
            self.windows[key] = torch.zeros(shape, dtype=dtype, device=self.canvas.device)
        return self.windows[key]

    def load(self, canvas: Tensor, attention: Tensor | None) -> None:
        """Copy the live rows' (b, l) canvas and attention in; the rest becomes padding."""
        b, l = canvas.shape
        self.canvas.fill_(self.pad_id)
        self.canvas[:b, :l].copy_(canvas)
        self.attention.zero_()
        if attention is None:
            self.attention[:b, :l].fill_(1)
        else:
            self.attention[:b, :l].copy_(attention)
        self.attention[b:, 0] = 1                     # dummy rows attend one column

    def take_rows(self, rows: Tensor, into: "StepBuffers") -> None:
        """Copy batch `rows` (n,) of the K/V into the first n rows of `into` (a row drop; `into`
        is this bucket or one of fewer rows and the same canvas width)."""
        n = rows.shape[0]
        for mine, theirs in ((self.kv.keys, into.kv.keys), (self.kv.values, into.kv.values)):
            theirs[:, :n].copy_(mine.index_select(1, rows))
