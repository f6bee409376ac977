"""dKV-Cache: delayed caching of decoded tokens' K/V (Ma, Yu, Fang, Wang, 2025, arXiv 2505.15781;
code horseee/dKV-Cache@49a76fc `generation_utils/llada_dkv_cache_decode.py`,
`models/modeling_llada_dkv_cache_decode.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.caches.layerwise import LayerState, Stack, check_model
from dllm_decode.interfaces import Cache, DiffusionLM
from dllm_decode.fields import MAX_CANVAS, bounded

_NEVER = -(1 << 30)              # "decoded before the decode began" (prompt, padding)


@dataclass
class DKVState:
    """The layer caches; per column the step it was first seen decoded (B, L); the masks of the
    last call (B, L); the call counter; the block starts of the recent calls (host ints); the
    step's counts."""

    layers: LayerState
    decoded_at: Tensor
    masked: Tensor
    step: int
    starts: tuple[int, ...]
    refreshed: Tensor
    recomputed: Tensor

    def select_rows(self, rows: Tensor) -> DKVState:
        pick = lambda t: t.index_select(0, rows)   # noqa: E731
        return DKVState(self.layers.select_rows(rows), pick(self.decoded_at), pick(self.masked),
                        self.step, self.starts, pick(self.refreshed), pick(self.recomputed))

    def trim(self, width: int) -> DKVState:
        return DKVState(self.layers.trim(width), self.decoded_at[:, :width], self.masked[:, :width],
                        self.step, self.starts, self.refreshed, self.recomputed)


@dataclass(frozen=True)
class DKVCache(Cache):
    """Recompute every masked column and every column decoded in the last `delay` steps; cache the
    K/V of every other column (dKV-Cache-Decode).

    A column's K/V computed while it was [MASK] are wrong for its token, and they change most at
    the step right after it is decoded, so a decoded column enters the cache only `delay` steps
    after its decoding (the reference: one step). Which columns were decoded when is read from the
    canvas each call (mask -> token since the last call). A full forward refreshes every column at
    block steps 0 and 1 and every `refresh_every` block steps (the reference's
    `cache_reloading_step`); refresh forwards are decode steps like the others and count one NFE.

    Defaults: `refresh_every = 8` (README, LLaDA decode), `delay = 1`.

    Deviations: rows may need different numbers of recomputed columns (any adaptive rule); the
    reference needs equal counts (`.view(B, -1)`) and runs LLaDA at batch 1. Here every cached step
    feeds a fixed number of columns (from the earliest block start of the last `delay` + 1 steps,
    where every recent commit lies, to the canvas end: no host sync): the chosen ones, then repeats of them ("padding picks", equal
    values, not counted in `recomputed`), so a cached step costs about what a `prefix` step does
    on this implementation; the saving the paper measures needs a ragged gather (one host sync per
    step) and is not claimed here. `block_refresh = False` drops the full forwards at block steps
    0 and 1 (only every `refresh_every` steps of the decode). The `greedy` variant (feeds only the
    next commits and a window around them) needs the commits before the forward and is not
    ported. LLaDA layout only (`caches/layerwise.py`); other families get a one-line error.
    """

    refresh_every: int = bounded(8, most=MAX_CANVAS, scales="steps")
    delay: int = bounded(1, most=MAX_CANVAS, scales="steps")
    block_refresh: bool = True

    def __post_init__(self) -> None:
        if self.refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1 (1: a full forward every step), got {self.refresh_every}")
        if self.delay < 0:
            raise ValueError(f"delay must be >= 0 (0: cache a column as soon as it is decoded), got {self.delay}")

    @property
    def mid_run_joins(self) -> bool:     # type: ignore[override]
        """A newcomer's first forward is a full one for every row, as block steps 0 and 1 are
        here; without `block_refresh` the running rows would not have refreshed alone."""
        return self.block_refresh

    def init_state(self, model: DiffusionLM) -> None:
        check_model(model, "dkv")
        return None

    def _full_due(self, block_step: int, step: int) -> bool:
        if self.block_refresh:
            return block_step <= 1 or block_step % self.refresh_every == 0
        return step % self.refresh_every == 0

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any) -> tuple[Tensor, int, Any]:
        stack, (s, _) = Stack(model), block
        batch, length = canvas.shape
        positions, mask, masked = stack.inputs(canvas, attention_mask, length, None)
        step = 0 if state is None else state.step + 1
        starts = (s,) if state is None else (*state.starts, s)[-(self.delay + 1):]
        if state is None:
            decoded_at = torch.full((batch, length), _NEVER, dtype=torch.long, device=canvas.device)
        else:   # columns that were masked at the last call and are not now: decoded at its step
            decoded_at = torch.where(state.masked & ~masked, step - 1, state.decoded_at)
        if state is None or self._full_due(block_step, step):
            h, layers = stack.full(canvas, positions, mask)
            full = torch.full((batch,), stack.depth, dtype=torch.long, device=canvas.device)
            state = DKVState(layers, decoded_at, masked, step, starts, full, torch.full_like(full, length))
            return stack.head(h[:, s:]), s, state
        chosen = masked | (step - decoded_at <= self.delay)
        a = min(starts)             # masks lie in the active block or after it; recent commits
        index, valid = _chosen_first(chosen[:, a:], a)
        h = stack.rows(state.layers, canvas, positions, mask, index)
        fed = torch.zeros(batch, length - a, h.shape[-1], dtype=h.dtype, device=h.device)
        fed = fed.scatter(1, (index - a)[..., None].expand_as(h), h)   # unfed columns: never read
        state = DKVState(state.layers, decoded_at, masked, step, starts, torch.zeros_like(state.refreshed),
                         valid.sum(-1))
        return stack.head(fed[:, s - a:]), s, state

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        return state.select_rows(rows) if isinstance(state, DKVState) else state

    def report(self, state: Any) -> dict[str, Tensor] | None:
        if not isinstance(state, DKVState):
            return None
        return {"refreshed_layers": state.refreshed, "recomputed": state.recomputed}

    def trim(self, state: Any, width: int) -> Any:
        return state.trim(width) if isinstance(state, DKVState) else state


def _chosen_first(chosen: Tensor, offset: int) -> tuple[Tensor, Tensor]:
    """(B, n) canvas columns with each row's chosen ones first (in column order), the rest
    replaced by the row's first chosen column (padding picks), and (B, n) which are chosen."""
    order = torch.sort((~chosen).to(torch.int8), dim=-1, stable=True).indices
    valid = chosen.gather(1, order)
    index = torch.where(valid, order, order[:, :1]) + offset
    return index, valid
