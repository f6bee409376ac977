"""DCD: deferred commitment decoding (Shu, Tian, Xu, Wang, Chen, 2026, arXiv 2601.02076; code
shuyingte/DCD@ea6a4b7 `decode_algorithm.py`, `window_bidirectional_decode`, `get_decode_num`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import masked_scores, topk_mask
from dllm_decode.fields import MAX_CANVAS, bounded


@dataclass(frozen=True)
class DCDScheduler(Scheduler):
    """A certainty-aware sliding window over the whole generation instead of hard blocks.

    The rule takes the whole generation as one block (`block_end` at the first step) and keeps,
    per row, a window [l, r): l is the row's first masked column, and r grows each step by what
    the last step committed, so about `window` masked columns stay in view (the reference's
    r <- min(r + w0 - masked left in the window, l + max_window, end of text)). Inside the window
    it commits every masked column with c >= `threshold`, at least the most confident one
    (`fixed > 0`: the `fixed` most confident instead). An uncertain column is never forced at a
    block end: it waits until more of its right context is committed.

    With `eos_pad` (the reference's sliding mode), a committed end-of-text token ends the row: the
    columns after it become end-of-text at once (`Decision.truncate_at`) and are never computed.

    Defaults: the paper runs' `window = 16`, `max_window = 128`, threshold 0.9 (run_all.sh, LLaDA
    and Dream). `window >= gen_length` is the threshold rule over one block of the whole
    generation.

    Deviations: the window is per row (the reference shares l and r across the batch, so its
    batched output differs from one by one); the window's r is rebuilt each step from the
    canvas (masked columns left in [l, r)) rather than from counters, so filters and the loop's
    forced progress keep it right; the reference's `prefix-delayW`/`dual-delayW` caches are not
    ported (the `prefix` and `dual` caches here recompute the whole generation, which is the
    block, and cache only the prompt); the block-model (`window_causal_decode`) variant is not
    ported. Ties commit (`>=`).
    """

    window: int = bounded(16, most=MAX_CANVAS, scales="memory")
    max_window: int = bounded(128, most=MAX_CANVAS, scales="memory")
    threshold: float = 0.9
    fixed: int = bounded(0, most=MAX_CANVAS, scales="memory")
    eos_pad: bool = True

    view: ClassVar[str] = "rest"                # its first step already sees past the config's block
    capturable: ClassVar[bool] = True           # tensor work only (the window is a state tensor)
    chooses_block_bounds: ClassVar[bool] = True
    caches: ClassVar[tuple[str, ...] | None] = ("none", "prefix", "dual")

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.max_window < self.window:
            raise ValueError(f"max_window must be >= window ({self.window}), got {self.max_window}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.fixed < 0:
            raise ValueError(f"fixed must be >= 0 (0: the threshold rule), got {self.fixed}")

    def init_state(self, batch_size: int, device: torch.device) -> Tensor:
        return torch.full((batch_size,), -1, dtype=torch.long, device=device)     # r, unset

    def block_end(self, inp: StepInput, state: Tensor) -> tuple[Tensor | None, Tensor]:
        return inp.gen_span[:, 1], state

    def select(self, inp: StepInput, state: Tensor) -> tuple[Decision, Tensor]:
        columns = inp.columns.unsqueeze(0)
        start, end = inp.block[:, :1], inp.block[:, 1:]
        open_ = inp.is_masked & (columns >= start) & (columns < end)
        first = torch.where(open_, columns, end).min(-1, keepdim=True).values        # l
        right = torch.where(state.unsqueeze(-1) < 0, first, state.unsqueeze(-1))
        left_in = (open_ & (columns < right)).sum(-1, keepdim=True)
        right = torch.minimum(torch.minimum(right + self.window - left_in, first + self.max_window), end)
        right = torch.maximum(right, first + 1)
        due = inp.eligible & (columns < right)
        scores = masked_scores(inp.confidence, due)
        if self.fixed:
            commit = topk_mask(scores, torch.full_like(right[:, 0], self.fixed))
        else:
            commit = (scores >= self.threshold) | topk_mask(scores, due.any(-1).long())
        commit = commit & due
        truncate = self._eos_cut(inp, commit) if self.eos_pad and inp.eos_ids else None
        return Decision(commit=commit, truncate_at=truncate), right.squeeze(-1)

    def _eos_cut(self, inp: StepInput, commit: Tensor) -> Tensor:
        """(B,) the column after the first end-of-text token this step commits (the generation
        end for rows that commit none)."""
        ids = torch.tensor(inp.eos_ids, dtype=torch.long, device=commit.device)
        eos = commit & torch.isin(inp.candidates, ids)
        cut = torch.where(eos, inp.columns.unsqueeze(0) + 1, inp.gen_span[:, 1:]).min(-1).values
        return torch.minimum(cut, inp.gen_span[:, 1])
