"""What an uncommitted canvas column holds: the canvas kind of a model, as the one loop runs it.

`Decoding` keeps one canvas of committed tokens per row, with the kind's `open_id` in every
column not committed yet (what `progress`, `snapshot` and streaming read), and asks its canvas
kind for the step's logits and for each request's turn:
- `MaskCanvas` (every masked diffusion LM): an open column holds [MASK], the model reads the
  canvas as it is through the request's cache, and a turn commits columns for good
  (`dllm_decode.turns`).
- `NoiseCanvas` (a model with `canvas_kind = "noise"`, DiffusionGemma): an open column holds a
  uniformly random token redrawn every step, kept beside the canvas per request; the model reads
  that noise canvas, and a turn accepts, re-noises and commits whole canvases
  (`dllm_decode.noise_turn`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode import noise_turn, turns
from dllm_decode.capture.dispatch import denoise_for
from dllm_decode.noise import canvas_kind
from dllm_decode.row_windows import RowWindows

NOISE_OPEN = -1
"""The noise canvas's open marker in the loop's canvas: never a token, never fed to the model."""


@dataclass(frozen=True)
class MaskCanvas:
    """An open column holds the model's [MASK] (`open_id`); `pad_id` fills padding and a row's
    region after its end of text."""

    open_id: int
    pad_id: int

    def join(self, model: Any, member: Any, rows: int, device: Any) -> None:
        """Nothing to keep beside the canvas."""

    def logits(self, runner: Any, model: Any, batch: Any, span: tuple[int, int], block_step: int,
               state: Any) -> tuple[Tensor, int, Any]:
        """The cache's (or captured executor's) logits for the window over the batch's canvas.

        A cache whose rows are computed apart and keep no state (`Cache.rows_apart`, the `none`
        cache with dense attention) feeds only the rows with work: a row whose block is done
        waits for its phase without a forward row (its logits are zeros; it has no open column
        to commit). Unmerged LoRA rows keep the whole batch (their adapter ids are per row). A
        cache that keeps per-row state inside the shared window (`Cache.own_windows`) gets each
        row's own block (`row_windows.RowWindows`)."""
        x, mask, busy = batch.rows.x, batch.rows.attention_mask, batch.bounds.busy
        if getattr(runner, "own_windows", False):
            rows = RowWindows.of(batch, getattr(model, "block_size", None))
            return runner.logits(model, x, mask, span, block_step, state, rows=rows)
        if (all(busy) or not any(busy) or state is not None or not getattr(runner, "rows_apart", False)
                or any(member.adapter >= 0 for member in batch.members)):
            return runner.logits(model, x, mask, span, block_step, state)
        rows = torch.tensor([r for r, working in enumerate(busy) if working], device=x.device)
        logits, offset, state = runner.logits(model, x[rows], None if mask is None else mask[rows],
                                              span, block_step, state)
        full = logits.new_zeros((len(busy), *logits.shape[1:]))
        full[rows] = logits
        return full, offset, state

    turn = staticmethod(turns.turn)

    @staticmethod
    def cache_capture(capture: Any) -> Any:
        """The capture the cache's executor runs: the one asked for."""
        return capture


@dataclass(frozen=True)
class NoiseCanvas:
    """An open column holds noise (see the module docstring); `open_id` is `NOISE_OPEN`;
    `denoise` runs the decoder forward (`model.denoise`, or its captured form:
    `capture.denoise_for`)."""

    pad_id: int
    open_id: int = NOISE_OPEN
    denoise: Any = None

    def join(self, model: Any, member: Any, rows: int, device: Any) -> None:
        """The request's noise canvas state (schedule, end-of-text rules, its encoder cache)."""
        member.noise = noise_turn.NoiseRows.of(model, member.config, rows, device)

    def logits(self, runner: Any, model: Any, batch: Any, span: tuple[int, int], block_step: int,
               state: Any) -> tuple[Tensor, int, Any]:
        """Each denoising request's own forward, placed in the window (`noise_turn.forward`)."""
        return noise_turn.forward(model, batch, span, block_step, self.denoise), span[0], state

    turn = staticmethod(noise_turn.turn)

    @staticmethod
    def cache_capture(capture: Any) -> Any:
        """The capture the cache's executor runs: none (a noise canvas captures its decoder
        forward, `denoise`, and no masked step)."""
        return "off"


def canvas_of(model: Any, trace: bool = False, capture: Any = "off") -> MaskCanvas | NoiseCanvas:
    """The model's canvas kind (a noise canvas with its decoder forward captured as `capture`
    asks, `capture.denoise_for`). Raises a one-line ValueError for what a noise canvas does not
    record: a step trace (it commits no columns step by step)."""
    if canvas_kind(model) != "noise":
        return MaskCanvas(model.mask_token_id, model.eos_token_ids[0])
    if trace:
        raise ValueError("a noise canvas records no step trace; decode with trace=False")
    pad = noise_turn.pad_of(model)         # else 0 (Gemma's pad): padding reaches the experts'
    return NoiseCanvas(pad if pad is not None else 0,   # matmuls, so it is fixed, not the EOS
                       denoise=denoise_for(model, capture))
