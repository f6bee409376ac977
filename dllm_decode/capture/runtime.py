"""`CapturedCache`: the step's model forward through the captured step, behind the `Cache`
methods the loop calls (`init_state`, `logits`, `select_rows`, `trim`, `report`), for the caches
whose fed rows are a contiguous range decided on the host: `none`, `prefix` and `dual` (any
vicinity, any refresh policy) and the exact `block` cache of block-diffusion models.

Per step, on the host: the compact stack is resolved (`compact_stack`: lock, fingerprint,
rebuild), the rows are copied into the bucket's `StepBuffers` and the window's indices are
written; then the bucket's callable (eager, compiled or a recorded CUDA graph) runs, and the
logits of the live rows and columns are handed to the loop. What stays dynamic stays on the
host between calls: block bounds, admission, row drops (the K/V rows move to the smaller
bucket), end-of-text truncation (trimmed columns simply stop being attended), the scheduler's
decision, sampling, and the step's one host sync (`Decoding._bookkeep`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.capture.buckets import Buckets
from dllm_decode.capture.buffers import StepBuffers
from dllm_decode.capture.graphs import CAPTURE_MODES, GraphCache
from dllm_decode.capture.step import Head
from dllm_decode.interfaces import Cache, DiffusionLM, NoCache
from dllm_decode.models.compact import compact_problem, compact_stack


@dataclass
class CapturedState:
    """A request batch's K/V in a bucket's buffers, and (block cache) where the last forward
    began: the columns from there on are recomputed by the next one."""

    buffers: StepBuffers
    written_from: int = 0


def cache_kind(cache: Any) -> str | None:
    """"none", "kv" (prefix / dual: a `BlockKVCache` with its own `logits`), "block", or None."""
    kind = type(cache)
    if kind is NoCache:
        return "none"
    for base in kind.__mro__:
        if base.__name__ == "BlockKVCache" and base.__module__.endswith("caches.kv"):
            return "kv" if kind.logits is base.logits else None
    if kind.__name__ == "BlockCache" and kind.__module__.endswith("caches.block"):
        return "block"
    return None


def capture_problem(config: Any, model: Any) -> str | None:
    """Why a decode of `config` (a `DecodeConfig`, or just its `Cache`) on `model` cannot run
    the captured step (a phrase), or None when it can. The scheduler, filters and temperature
    never stop it: the decision runs on the host side of the step."""
    cache = getattr(config, "cache", config)
    if (problem := compact_problem(model)) is not None:
        return problem
    try:
        Head.of(model)
    except TypeError as error:
        return str(error)
    if cache_kind(cache) is None:
        return (f"cache {type(cache).__name__} chooses its rows from the data (captured: none, "
                f"prefix, dual, block)")
    return None


class CapturedCache:
    """The loop's cache calls, run through the captured step in `graphs.mode`.

    Args:
        cache: the decode's cache (its policy: refresh steps, the rows of a cached step).
        model: the model (its family's head and its compact stack).
        graphs: the per-bucket callables.
    """

    def __init__(self, cache: Cache, model: DiffusionLM, graphs: GraphCache):
        self.cache, self.graphs = cache, graphs
        self.kind = cache_kind(cache)
        self.head = Head.of(model)
        if graphs.mode == "cuda-graphs" and self.head.device.type != "cuda":
            raise ValueError(f"cuda-graphs needs the model on a CUDA device; it is on "
                             f"{self.head.device} (load it with device='cuda')")
        self.buckets: Buckets | None = None
        _, blocks = model.parts()
        self.layers = len(blocks)
        self.pad_id = model.eos_token_ids[0]
        self.max_length = int(getattr(model, "max_length", None) or 0)

    # -- the Cache methods the loop calls --------------------------------------------------------

    def init_state(self, model: DiffusionLM) -> None:
        self.cache.init_state(model)         # the cache's own check (a model it cannot serve)
        return None

    def report(self, state: Any) -> None:
        return None

    def trim(self, state: Any, width: int) -> Any:
        return state                         # trimmed columns are no longer attended

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        """Keep batch `rows` of the K/V, moved to the smallest batch bucket that holds them."""
        if not isinstance(state, CapturedState):
            return state
        old = state.buffers
        new = self._buffers(rows.shape[0], old.length, like=old)
        old.take_rows(rows.to(old.canvas.device), new)
        return CapturedState(new, state.written_from)

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any) -> tuple[Tensor, int, Any]:
        batch, length = canvas.shape
        lo, hi = block
        shift = self.head.shift
        if self.buckets is None:             # window widths from the first block
            self.buckets = Buckets(max_batch=self.graphs.max_batch,
                                   length_step=self.graphs.length_step, block_length=hi - lo,
                                   widths=(hi - lo + shift,))
        refresh = state is None
        if self.kind == "none":              # a full forward every step
            refresh, rows, written_from = True, (lo, length), 0
        elif self.kind == "kv":
            refresh = refresh or self.cache._refresh_due(block_step)
            rows = (lo, length) if refresh else self.cache.rows(block, length)
            written_from = 0
        else:                                # block: the first forward covers the active blocks
            rows = (lo, hi) if refresh else (min(state.written_from, lo), hi)
            written_from = lo
        stack = compact_stack(model)         # host: its lock, fingerprint and rebuild
        if refresh:
            buffers = self._buffers(batch, length, stack=stack)
            fed = (0, buffers.length + 1)
        else:
            buffers = state.buffers
            fed = (max(rows[0] - shift, 0), rows[1])
        logits = self._run(stack, buffers, canvas, attention_mask, fed, rows)
        return logits, rows[0], CapturedState(buffers, written_from)

    # -- the step ------------------------------------------------------------------------------

    def _buffers(self, batch: int, length: int, like: StepBuffers | None = None,
                 stack: Any = None) -> StepBuffers:
        """The buffers of the (batch, canvas) bucket holding `batch` rows of `length` columns
        (`like`'s canvas bucket and K/V layout when given, else `stack`'s). They belong to the
        `GraphCache`, not to this decode: a graph recorded by one decode reads the same
        addresses in the next."""
        buckets = self.buckets or Buckets(max_batch=self.graphs.max_batch,
                                          length_step=self.graphs.length_step)
        if like is not None:
            keys = like.kv.keys
            layout = (keys.shape[2], keys.shape[4], keys.dtype, keys.device)
        else:
            first = stack.blocks[0]
            layout = (first.kv_heads, first.head_dim, first.qkv.dtype, first.qkv.device)
        size = (buckets.batch(batch), like.length if like is not None else buckets.length(length))
        key = (*size, self.layers, *layout, self.pad_id)
        if key not in self.graphs.buffers:
            self.graphs.buffers[key] = StepBuffers.allocate(*size, self.layers, *layout,
                                                            pad_id=self.pad_id)
        return self.graphs.buffers[key]

    def _run(self, stack: Any, buffers: StepBuffers, canvas: Tensor, attention_mask: Tensor | None,
             fed: tuple[int, int], rows: tuple[int, int]) -> Tensor:
        """Load the rows, write the window's indices, run the bucket; (b, rows width, V) logits."""
        batch, length = canvas.shape
        width, limit = buffers.length, buffers.length + 1
        buckets = self.buckets
        fed_width = buckets.width(fed[1] - fed[0], limit)
        out_width = buckets.width(rows[1] - rows[0], limit)
        buffers.load(canvas, attention_mask)
        device = buffers.canvas.device
        columns = torch.arange(fed_width, device=device) + fed[0]
        buffers.index("fed", fed_width).copy_(torch.where(columns < fed[1], columns, width))
        out = (torch.arange(out_width, device=device) + (rows[0] - fed[0])).clamp_max(fed_width - 1)
        buffers.index("out", out_width).copy_(out)
        buffers.index("prev", out_width).copy_((out - 1).clamp_min(0))
        stack.rotary.reserve(max(self.max_length, width) + 1)
        cos, sin = stack.rotary.tables
        args = (stack, self.head, cos, sin, buffers.canvas, buffers.attention, buffers.kv.keys,
                buffers.kv.values, buffers.index("fed", fed_width), buffers.index("out", out_width),
                buffers.index("prev", out_width))
        key = (buffers.batch, width, fed_width, out_width)
        logits = self.graphs.run(key, (id(stack), cos.data_ptr()), args)[:batch, :rows[1] - rows[0]]
        return logits.clone() if self.graphs.mode == "cuda-graphs" else logits


def captured_cache(model: DiffusionLM, cache: Cache, capture: str | GraphCache) -> tuple[Any, str | None]:
    """What `Decoding` runs its cache calls through: `cache` itself (`capture` "off", or a
    configuration the captured step cannot serve: the reason comes second) or a `CapturedCache`.

    Raises:
        ValueError: an unknown capture mode, or `cuda-graphs` without CUDA.
    """
    graphs = graph_cache(capture)
    if graphs is None:
        return cache, None
    if (problem := capture_problem(cache, model)) is not None:
        return cache, problem
    return CapturedCache(cache, model, graphs), None


def graph_cache(capture: Any) -> GraphCache | None:
    """The `GraphCache` a `capture` argument names (None for "off").

    Raises:
        TypeError / ValueError: not one of `CAPTURE_MODES` nor a `GraphCache`; `cuda-graphs`
            without CUDA.
    """
    if isinstance(capture, GraphCache):
        return capture
    if not isinstance(capture, str):
        raise TypeError(f"capture must be one of {list(CAPTURE_MODES)} or a GraphCache, got "
                        f"{type(capture).__name__}")
    if capture not in CAPTURE_MODES:
        raise ValueError(f"capture must be one of {list(CAPTURE_MODES)}, got {capture!r}")
    return None if capture == "off" else GraphCache(capture)
