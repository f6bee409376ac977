"""Decoding block-diffusion models the way their references do: whole blocks on the model's grid,
and, for token-shifted models, a block's first position committed alone in the block's first step.

Block-diffusion models (Fast-dLLM v2, SDAR, LLaDA2) are trained and decoded on a fixed grid of
`block_size` positions anchored at position 0: block j is positions `[j*b, (j+1)*b)`, attention
is bidirectional inside a block and causal across blocks. Their reference decoders therefore:

* decode whole blocks: the canvas of a prompt of P tokens and a request for G tokens runs to the
  next grid boundary, `ceil((P + G) / b) * b` positions (SDAR `block_diffusion_generate`, LLaDA2
  `generate`; Fast-dLLM v2 `batch_sample` also stops on a boundary), and the answer is cut to G
  tokens. Cutting the last block short instead changes its logits, since every position of a
  block attends its masked tail. `grid_canvas` extends a canvas to whole blocks.
* token-shifted models (Fast-dLLM v2: the network's row i predicts position i + 1) predict a
  block's first position from the last row of the previous block, which never sees the block, so
  that logit is fixed before the block's first step. The reference commits it at once, on its
  own, from the forward that writes the previous block into the KV cache (after a prefill that
  ends on the grid, from the prefill's last row); the block's denoising steps then start with it
  in place. `block_start_columns` restricts a block's first step to that one position: the
  loop's first forward of a block (the block cache's fused KV-write forward, or a full forward)
  already computes the row, so no forward is added.

These functions are the loop's hooks; both are no-ops for models without a grid
(`block_size`) or, for the block start, without `block_start_first`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def grid_tails(model: Any, prompt_lengths: Sequence[int], gen_length: int) -> list[int]:
    """Per row, the positions past `prompt + gen_length` up to the next boundary of the model's
    block grid (all zeros for a model without `block_size`)."""
    grid = getattr(model, "block_size", None)
    if not grid:
        return [0] * len(prompt_lengths)
    return [-(length + gen_length) % grid for length in prompt_lengths]


def grid_canvas(model: Any, canvas: Tensor, attention_mask: Tensor | None,
                prompt_lengths: Sequence[int], gen_length: int, mask_id: int,
                pad_id: int) -> tuple[Tensor, Tensor | None]:
    """A right-aligned canvas `[padding][prompt][G masks]` extended so every row decodes whole
    model blocks.

    Every row gains the masks up to the end of its last grid block; rows are right-aligned, so
    the canvas grows by the largest tail and a row with a shorter tail has its extra columns cut
    (token `pad_id`, attention 0: never attended, never decoded, the state a truncated row's
    tail has). Unchanged (the same objects) for a model without a grid or when every row already
    ends on it. The caller keeps the first G generated columns as the answer.
    """
    tails = grid_tails(model, prompt_lengths, gen_length)
    extra = max(tails, default=0)
    if extra == 0:
        return canvas, attention_mask
    rows, width = canvas.shape
    device = canvas.device
    grown = torch.cat([canvas, canvas.new_full((rows, extra), mask_id)], dim=1)
    ends = width + torch.tensor(tails, device=device)
    cut = torch.arange(width + extra, device=device) >= ends.unsqueeze(-1)
    mask = torch.ones_like(canvas) if attention_mask is None else attention_mask
    mask = torch.cat([mask, mask.new_ones(rows, extra)], dim=1)
    if not cut.any() and attention_mask is None:
        return grown, None
    return grown.masked_fill(cut, pad_id), mask.masked_fill(cut, 0)


def block_start_columns(model: Any, is_masked: Tensor, columns: Tensor, block_starts: Tensor,
                        start_positions: Sequence[int]) -> Tensor | None:
    """Which window columns a block's FIRST step may commit, or None (no restriction).

    For a model with `block_start_first` (token-shifted block diffusion), a row whose active block
    starts on the model's grid with that first position still masked may commit only that
    position: its logit comes from the previous block and is final (the reference's
    autoregressive block-start token). Other rows (the block starts inside the prompt, or a
    sub-block that does not start a model block) are unrestricted.

    Args:
        is_masked: (b, W) the window's masked columns.
        columns: (W,) the window's canvas columns.
        block_starts: (b, 1) each row's active block start column.
        start_positions: each row's position (real tokens before it) of its block start.
    Returns:
        (b, W) bool, True where the first step may commit; None when the model has no such rule.
    """
    grid = getattr(model, "block_size", None)
    if not grid or not getattr(model, "block_start_first", False):
        return None
    on_grid = torch.tensor([p % grid == 0 for p in start_positions], device=is_masked.device)
    at_start = columns.unsqueeze(0) == block_starts                        # (b, W)
    alone = on_grid & (is_masked & at_start).any(-1)                       # (b,)
    return at_start | ~alone.unsqueeze(-1)
