"""The Learn2PD feature: the active block's confidence vector at a fixed width.

One function serves the filter at decode time and the training recipe (which reads the same
values back from `generate(..., trace=True)`), so the two can never drift apart.
"""

from __future__ import annotations

import torch
from torch import Tensor

SETTLED = 1.0
"""Feature value of a block slot that is not masked (already committed, truncated, or past the
block end when the block is narrower than the filter). Learn2PD feeds the model's top-1
probability at committed positions, which a trained model puts near 1; the loop's view (and its
trace) carries -inf there, so the constant keeps decode-time and training features identical."""


def block_slots(offset: int, block: Tensor, window_width: int, width: int) -> tuple[Tensor, Tensor]:
    """Window column of each of the `width` filter slots, and whether the slot is real.

    Args:
        offset: canvas column of window column 0.
        block: (B, 2) long, each row's active block `[start, end)` in canvas columns.
        window_width: W, columns in the step's window.
        width: the filter's input width (Learn2PD: the block length it was trained on).
    Returns:
        (B, width) long window column (clamped into range) and (B, width) bool, True where the
        slot lies inside the row's block and the window. A block wider than `width` is cropped
        to its first `width` columns.
    """
    slot = torch.arange(width, device=block.device)
    column = block[:, :1] - offset + slot                                  # (B, width)
    real = (column < block[:, 1:] - offset) & (column < window_width) & (column >= 0)
    return column.clamp(0, window_width - 1), real


def block_confidence(confidence: Tensor, offset: int, block: Tensor, width: int) -> Tensor:
    """(B, W) step confidences (-inf where not eligible) -> (B, width) float32 features.

    Masked slots carry their top-1 (candidate) probability; every other slot carries `SETTLED`.
    """
    column, real = block_slots(offset, block, confidence.shape[1], width)
    values = confidence.float().gather(1, column)
    return torch.where(real & torch.isfinite(values), values, SETTLED)


def slots_to_window(per_slot: Tensor, offset: int, block: Tensor, window_width: int) -> Tensor:
    """(B, width) bool per filter slot -> (B, W) bool per window column (False outside the slots)."""
    width = per_slot.shape[1]
    column = torch.arange(window_width, device=block.device)
    slot = column + offset - block[:, :1]                                  # (B, W)
    inside = (slot >= 0) & (slot < width) & (column + offset < block[:, 1:])
    return per_slot.gather(1, slot.clamp(0, width - 1)) & inside
