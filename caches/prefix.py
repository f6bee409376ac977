"""Fast-dLLM's PrefixCache (`generate_with_prefix_cache`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from dllm_decode.caches.kv import BlockKVCache
from dllm_decode.interfaces import DiffusionLM
from dllm_decode.models.layers import KVCache
from dllm_decode.row_windows import RowWindows


@dataclass(frozen=True)
class Resumed:
    """A cache seeded with stored prompt K/V (`dllm_decode.prefix_reuse`, approximate mode): the
    next forward feeds the rows from `restart` on instead of a full refresh."""

    kv: KVCache
    restart: int


@dataclass(frozen=True)
class PrefixCache(BlockKVCache):
    """Cache the K/V before the block; every step recomputes the block and everything after it.

    Each step feeds canvas rows `[s, L)` against the prefix K/V `[0, s)` stored by the last
    refresh (Wu et al., 2025, arXiv 2505.22618, §3.2). Approximate with two or more layers: the
    prefix tokens do not change inside a block, but their K/V at layers >= 1 were computed while
    the block was still masked. Exact with one layer, or with `refresh_every=1`.

    Deviation from the reference: the fresh K/V of rows `[s, L)` are written into the cache
    (the reference discards them); the next step recomputes those rows anyway, so the logits
    are the same.

    Cross-request reuse (`prefix_reuse = "approximate"`, opt-in at the engine): a batch's first
    forward may start from prompt K/V stored by earlier requests (`Resumed`). On a bidirectional
    model those K/V were computed with another canvas after the prompt, so this is an
    approximation of the same kind as the cache's own: the first refresh of a request skips its
    stored prompt columns; every later block start refreshes everything as usual.
    """

    prefix_reuse: ClassVar[str | None] = "approximate"

    def rows(self, block: tuple[int, int], length: int) -> tuple[int, int]:
        return block[0], length

    def resume(self, kv: KVCache, restart: int) -> Resumed:
        return Resumed(kv, restart)

    def kv_of(self, state: Any) -> KVCache | None:
        return state if isinstance(state, KVCache) and state.filled else None

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any,
               rows: RowWindows | None = None) -> tuple[Tensor, int, Any]:
        if isinstance(state, Resumed):          # the rows after the stored prompt columns
            fed = (min(state.restart, block[0]), canvas.shape[1])
            return model(canvas, attention_mask, kv=state.kv, rows=fed), fed[0], state.kv
        return super().logits(model, canvas, attention_mask, block, block_step, state, rows)

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        if isinstance(state, Resumed):
            return Resumed(state.kv.select_rows(rows), state.restart)
        return super().select_rows(state, rows)
