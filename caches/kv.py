"""What the prefix and dual caches share: the refresh policy and the per-request `KVCache` state.

Fast-dLLM v1 (Wu et al., 2025, arXiv 2505.22618, §3.2)
refreshes the whole cache with one full forward at the start of every semi-autoregressive block;
dInfer's `cache_update_freq` also refreshes every N steps inside a block. A refresh forward's
logits are that step's logits (it counts one NFE like every forward); in-block steps feed only
some rows and attend to the cached K/V of the others. The model does the caching: a forward with
an empty `KVCache` stores every layer's rotated K/V, a forward with a filled one computes only
`rows`, writes their fresh K/V in place and attends over every column.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.compat import accepted_hint
from dllm_decode.interfaces import Cache, DiffusionLM, StepPlan
from dllm_decode.models.layers import KVCache
from dllm_decode.row_windows import RowWindows


@dataclass(frozen=True)
class BlockKVCache(Cache):
    """A block-level KV cache refreshed at each block start (and every `refresh_every` steps).

    Attributes:
        refresh_every: also refresh at in-block steps `refresh_every`, `2 * refresh_every`, ...
            None = only at the block start (Fast-dLLM's default). 1 = a full forward every step,
            which makes the cache exact (the same logits as `none`).
        block_refresh: refresh at every block start (Fast-dLLM). False: one full forward per
            decode (and after the batch changes); later blocks only recompute their rows (plus
            the vicinity), so a decode whose blocks finish in one or two steps stops paying a full
            forward per block. Deviation from Fast-dLLM, more approximate: the blocks before the
            active one keep the K/V of their last step, computed before its final commits. A
            newcomer's first forward would refresh the running rows too, so a running batch then
            takes no newcomer mid-run (`mid_run_joins`).

    In a batch, every row keeps its own window (`own_windows`): the step feeds the rows every
    row needs, and each row's K/V outside the rows its own block would feed stay as its cache
    holds them (`KVCache.keep`). So a request that joins rows in a later block, or rows of
    another block length, does not change their tokens; a row whose block is done waits with
    nothing rewritten.
    """

    refresh_every: int | None = bounded(None, most=MAX_CANVAS, scales="memory")
    block_refresh: bool = True

    def __post_init__(self) -> None:
        if self.refresh_every is not None and self.refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1 or None, got {self.refresh_every}")

    def init_state(self, model: DiffusionLM) -> KVCache:
        """An empty cache for a new request.

        Raises:
            ValueError: the model has no KV cache (`supports_kv` missing or False).
        """
        if not getattr(model, "supports_kv", False):
            name = getattr(model, "name_or_path", None) or type(model).__name__
            raise ValueError(f"cache {type(self).__name__} needs a model with a KV cache, and "
                             f"{name} has none (supports_kv is False){accepted_hint(model)}")
        return KVCache.for_model(model)

    capturable: ClassVar[bool] = True
    own_windows: ClassVar[bool] = True

    @property
    def mid_run_joins(self) -> bool:     # type: ignore[override]
        """A newcomer's first forward refreshes every row, as every block start does here; without
        `block_refresh` the running rows would not have refreshed alone."""
        return self.block_refresh

    def plan(self, block: tuple[int, int], block_step: int, length: int,
             restart: int | None) -> StepPlan:
        """A refresh (nothing cached, a block start, every `refresh_every` steps) recomputes
        the rest of the canvas, as `none` gives it; a cached step its `rows`."""
        refresh = restart is None or (block_step == 0 and self.block_refresh) or (
            self.refresh_every is not None and block_step % self.refresh_every == 0)
        rows = (block[0], length) if refresh else self.rows(block, length)
        return StepPlan(rows, rebuild=refresh, restart=rows[0])

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any,
               rows: RowWindows | None = None) -> tuple[Tensor, int, Any]:
        """The plan's forward. `rows`: each row's own block; a cached step then leaves every
        row's K/V outside its own `rows(...)` window as that row's last refresh left them."""
        cached = state is not None and state.filled
        plan = self.plan(block, block_step, canvas.shape[1], 0 if cached else None)
        if plan.rebuild:        # a fresh KVCache (not a cleared one): nothing outside may alias it
            state = self.init_state(model)
        else:
            state.keep = None if rows is None else rows.keep(
                lambda own: self.rows(own, canvas.shape[1]), canvas.shape[1], canvas.device,
                lookback=getattr(model, "token_shift", 0))
        return model(canvas, attention_mask, kv=state, rows=plan.rows), plan.rows[0], state

    @abc.abstractmethod
    def rows(self, block: tuple[int, int], length: int) -> tuple[int, int]:
        """Canvas rows `[a, b)` an in-block (cached) step recomputes, with `a <= block[0]`."""

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        """Keep batch `rows` of every layer's K/V (the loop dropped finished rows)."""
        return state.select_rows(rows) if isinstance(state, KVCache) and state.filled else state

    def trim(self, state: Any, width: int) -> Any:
        """Keep the first `width` columns of every layer's K/V (the loop cut the dead tail)."""
        return state.trim(width) if isinstance(state, KVCache) and state.filled else state
