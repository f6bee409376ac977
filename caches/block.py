"""The exact block cache of block-diffusion models (Fast-dLLM v2, SDAR, LLaDA2, BD3-LM).

Under block-causal attention no position attends a later block, so a finished block's K/V never
change once its tokens are final: caching them is exact, not an approximation like Fast-dLLM v1's
dual cache of a bidirectional model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from dllm_decode.compat import accepted_hint
from dllm_decode.interfaces import Cache, DiffusionLM, StepPlan
from dllm_decode.models.layers import KVCache
from dllm_decode.errors import model_name


@dataclass
class BlockState:
    """The K/V of every column computed so far, and where the last forward began: the columns
    from there on were written before that step's commits, so the next forward recomputes them."""

    kv: KVCache
    written_from: int

    def select_rows(self, rows: Tensor) -> BlockState:
        return BlockState(self.kv.select_rows(rows), self.written_from)

    def trim(self, width: int) -> BlockState:
        return BlockState(self.kv.trim(width), self.written_from)


@dataclass(frozen=True)
class BlockCache(Cache):
    """Cache the K/V of finished blocks; each step computes only the active block(s).

    The first step of a request computes the canvas up to the end of the active blocks once (an
    empty cache stores every layer's K/V; what lies after is never attended before it is written). Every later step feeds the rows from the earliest column the previous step fed
    to the end of the active model blocks: at a block start that re-computes the block just
    finished, now with its final tokens, in the same forward that decodes the new block (the
    references spend a separate "KV-write" forward on it: one NFE per block fewer here). Sub-block
    decoding (a decode block shorter than the model's) still feeds whole model blocks, so the
    cache stays exact. Logits equal the uncached model's up to float rounding of differently
    shaped matrix products (the tests hold them within 1e-5 in float32; exact in float64).

    Raises:
        ValueError: at the first step, a model without block-causal attention (`block_size`).
    """

    def init_state(self, model: DiffusionLM) -> BlockState | None:
        if not getattr(model, "block_size", None) or not getattr(model, "supports_kv", False):
            name = model_name(model)
            raise ValueError(f"cache BlockCache needs a block-causal model with a KV cache "
                             f"(block_size), and {name} is not one{accepted_hint(model)}")
        return None

    capturable: ClassVar[bool] = True
    prefix_reuse: ClassVar[str | None] = "exact"     # a finished block's K/V never change

    def resume(self, kv: KVCache, restart: int) -> BlockState:
        return BlockState(kv, restart)

    def kv_of(self, state: Any) -> KVCache | None:
        return state.kv if isinstance(state, BlockState) else None

    def plan(self, block: tuple[int, int], block_step: int, length: int,
             restart: int | None) -> StepPlan:
        """The first forward computes `[0, hi)` and returns the active blocks; a later one the
        rows from the earliest column the previous step fed to the end of the active blocks."""
        lo, hi = block
        start = lo if restart is None else min(restart, lo)
        return StepPlan((start, hi), rebuild=restart is None, restart=lo)

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any) -> tuple[Tensor, int, Any]:
        plan = self.plan(block, block_step, canvas.shape[1], None if state is None else state.written_from)
        (start, hi), length = plan.rows, canvas.shape[1]
        if plan.rebuild:
            # Columns after the active blocks are invisible to it (block-causal), so the first
            # forward covers [0, hi) only; the rest of the cache is zeros until a forward writes it.
            kv = KVCache.for_model(model)
            mask = attention_mask[:, :hi] if attention_mask is not None else None
            logits = model(canvas[:, :hi], mask, kv=kv, rows=plan.rows)
            return logits, start, BlockState(kv.pad_to(length), plan.restart)
        logits = model(canvas, attention_mask, kv=state.kv, rows=plan.rows)
        return logits, start, BlockState(state.kv, plan.restart)

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        return state.select_rows(rows) if isinstance(state, BlockState) else state
