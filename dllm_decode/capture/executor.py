"""`CapturedExecutor`: runs a cache's `StepPlan` (`Cache.plan`: which rows a step computes)
through the captured step, behind the calls the loop makes of its cache (`init_state`, `logits`,
`select_rows`, `trim`, `report`), plus `step`, the whole step in one graph.

The eager executor is the cache itself: its `logits` runs the same plan as a model call. Per
step, on the host: the plan, the compact stack (`compact_stack`: lock, fingerprint, rebuild),
the rows copied into the bucket's `StepBuffers`, the window's indices; then the bucket's callable
(eager, compiled or a recorded CUDA graph) runs. What stays dynamic stays on the host between
calls: block bounds, admission, row drops (the K/V rows move to the smaller bucket), end-of-text
truncation (trimmed columns stop being attended) and the step's one host sync
(`Decoding._bookkeep`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.capture.buckets import Buckets
from dllm_decode.capture.buffers import StepBuffers
from dllm_decode.capture.graphs import GraphCache
from dllm_decode.capture.step import Head, captured_forward, captured_step
from dllm_decode.interfaces import Cache, DiffusionLM, StepPlan
from dllm_decode.models.compact import compact_stack
from dllm_decode.records import Outcome
from dllm_decode.row_windows import RowWindows
from dllm_decode.step import Resolved


@dataclass
class CapturedState:
    """A request batch's K/V in a bucket's buffers, and where the last plan said the next step
    restarts."""

    buffers: StepBuffers
    restart: int


@dataclass
class _Call:
    """One prepared call: its bucket key, owners, arguments, plan and new state."""

    key: tuple
    owner: tuple
    args: tuple
    plan: StepPlan
    state: CapturedState


class CapturedExecutor:
    """A `capturable` cache's plans, run through the captured step in `graphs.mode`.

    Args:
        cache: the decode's cache (its plan: refresh steps, the rows of a cached step).
        model: the model (its family's modules and its compact stack).
        graphs: the per-bucket callables.
    """

    def __init__(self, cache: Cache, model: DiffusionLM, graphs: GraphCache):
        self.cache, self.graphs = cache, graphs
        # each row's own window inside the shared one: the captured step's `keep` columns
        self.own_windows, self.mid_run_joins = cache.own_windows, cache.mid_run_joins
        self.head = Head.of(model)
        if graphs.mode == "cuda-graphs" and self.head.device.type != "cuda":
            raise ValueError(f"cuda-graphs needs the model on a CUDA device; it is on "
                             f"{self.head.device} (load it with device='cuda')")
        self.buckets: Buckets | None = None
        _, blocks = model.parts()
        self.layers = len(blocks)
        self.pad_id = model.eos_token_ids[0]
        self.max_length = int(getattr(model, "max_length", None) or 0)
        self.kv_store = getattr(model, "kv_store", None)     # low-precision K/V (`kv_cache_dtype`)

    # -- the cache calls the loop makes --------------------------------------------------------

    def init_state(self, model: DiffusionLM) -> None:
        self.cache.init_state(model)         # the cache's own check (a model it cannot serve)
        return None

    def admit(self, state: Any, model: DiffusionLM) -> None:
        return self.init_state(model)        # joining rows: the K/V start afresh

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
        return CapturedState(new, state.restart)

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any,
               rows: RowWindows | None = None) -> tuple[Tensor, int, Any]:
        """The step's model forward: (b, rows, V) logits of the plan's rows (`rows`: each row's
        own block, for an `own_windows` cache)."""
        with self.graphs.checking():
            call = self._prepare(model, canvas, attention_mask, block, block_step, state, own=rows)
            (a, b), batch = call.plan.rows, canvas.shape[0]
            logits = self.graphs.run(call.key, call.owner, call.args, fn=captured_forward)[:batch, :b - a]
            if self.graphs.mode == "cuda-graphs":
                logits = logits.clone()
        return logits, a, call.state

    def step(self, model: DiffusionLM, batch: Any, block: tuple[int, int], block_step: int,
             state: Any, budgets: dict[int, int], mask_id: int, eos_ids: tuple[int, ...],
             draw: Callable[[Any, Tensor, int], None]) -> tuple[Outcome, int, Any]:
        """The whole step (`captured_step`) of a `running.Batch` whose requests share one rule,
        temperature and step budget (`dispatch.phase_problem`); `draw(batch, uniform, offset)`
        fills the sampling draws of a window from canvas column `offset` (`turns.draw`, as the
        eager step draws them). Returns the `Outcome` over the window `[offset, block end)`,
        `offset` and the new state."""
        g = next(iter(batch.groups))
        config, phase = batch.members[g].config, batch.phase
        scheduler, temperature = config.scheduler, config.temperature
        with self.graphs.checking():
            canvas = batch.rows.x
            own = RowWindows.of(batch, self.head.block_size) if self.own_windows else None
            call = self._prepare(model, canvas, batch.rows.attention_mask, block, block_step, state,
                                 upto=block[1], own=own)
            buffers, (a, _), rows = call.state.buffers, call.plan.rows, canvas.shape[0]
            out_width = call.args[9].shape[0]
            statics = [buffers.static(name, (buffers.batch, *shape)) for name, shape in
                       (("block", (2,)), ("gen_span", (2,)), ("region_start", ()))]
            for target, value in zip(statics, (phase.block, phase.gen_span, phase.region_start)):
                target[:rows].copy_(value)
            step, budget = buffers.static("step", ()), buffers.static("num_steps", ())
            step.fill_(block_step)
            budget.fill_(budgets[g])
            uniform = None
            if temperature > 0:
                uniform = buffers.static("uniform", (buffers.batch, out_width, self.head.vocab), torch.float64)
                uniform.fill_(float("nan"))
                draw(batch, uniform[:rows], a)
            args = (*call.args, *statics, step, budget, uniform, scheduler, temperature, mask_id, eos_ids)
            resolved, *rest = self.graphs.run(("step", *call.key, scheduler, temperature), call.owner,
                                              args, fn=captured_step)
            width = block[1] - a
            cut = lambda t: t[:rows, :width].clone()           # noqa: E731  (replays overwrite)
            outcome = Outcome(Resolved(*(cut(t) for t in resolved)),
                              *(t[:rows].clone() for t in rest), truncates=True)
        return outcome, a, call.state

    # -- the captured call ---------------------------------------------------------------------

    def _prepare(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
                 block: tuple[int, int], block_step: int, state: Any, upto: int | None = None,
                 own: RowWindows | None = None) -> _Call:
        """The cache's plan, the bucket's buffers loaded, the window's indices written; the
        window returns the plan's rows (up to column `upto`: the whole step reads its block).
        `own`: each row's own block; a cached step keeps each row's K/V outside the window its
        own plan would feed."""
        batch, length = canvas.shape
        lo, hi = block
        shift = self.head.shift
        if self.buckets is None:             # window widths from the first block
            self.buckets = Buckets(max_batch=self.graphs.max_batch,
                                   length_step=self.graphs.length_step, block_length=hi - lo,
                                   widths=(hi - lo + shift + 1,))
        plan = self.cache.plan(block, block_step, length, None if state is None else state.restart)
        stack = compact_stack(model)         # host: its lock, fingerprint and rebuild
        if plan.rebuild:
            buffers = self._buffers(batch, length, stack=stack)
            fed = (0, buffers.length + 1)
        else:
            buffers = state.buffers
            fed = (max(plan.rows[0] - shift, 0), plan.rows[1])
        buffers.load(canvas, attention_mask)
        rows, width, limit = plan.rows, buffers.length, buffers.length + 1
        # a window always feeds one scratch row: its padded columns read and write that one
        fed_count, out_count = fed[1] - fed[0], min(rows[1], upto or rows[1]) - rows[0]
        fed_width = self.buckets.width(fed_count if fed[1] == limit else fed_count + 1, limit)
        out_width = self.buckets.width(out_count, limit)
        device = buffers.canvas.device
        columns = torch.arange(fed_width, device=device) + fed[0]
        fed_index = buffers.index("fed", fed_width)
        fed_index.copy_(torch.where(columns < fed[1], columns, width))
        slots = torch.arange(out_width, device=device)
        out = buffers.index("out", out_width)
        out.copy_(torch.where(slots < out_count, slots + (rows[0] - fed[0]), fed_width - 1))
        prev = buffers.index("prev", out_width)
        prev.copy_((out - 1).clamp_min(0))
        keep = buffers.static("keep", (buffers.batch, fed_width), torch.bool)
        keep.zero_()
        kept = None if plan.rebuild or own is None else own.keep(
            lambda mine: self.cache.plan(mine, block_step, length, state.restart).rows, length, device,
            lookback=shift)
        if kept is not None:                 # the scratch column L is never kept
            kept = torch.cat([kept, kept.new_zeros(batch, width + 1 - length)], 1)
            keep[:batch].copy_(kept.index_select(1, fed_index))
        stack.rotary.reserve(max(self.max_length, width) + 1)
        cos, sin = stack.rotary.tables
        args = (stack, self.head, cos, sin, buffers.canvas, buffers.attention, buffers.kv.keys,
                buffers.kv.values, fed_index, out, prev, keep)
        return _Call((buffers.batch, width, fed_width, out_width), (stack, cos), args, plan,
                     CapturedState(buffers, plan.restart))

    def _buffers(self, batch: int, length: int, like: StepBuffers | None = None,
                 stack: Any = None) -> StepBuffers:
        """The buffers of the (batch, canvas) bucket holding `batch` rows of `length` columns
        (`like`'s canvas bucket and K/V layout when given, else `stack`'s). They belong to the
        `GraphCache`, not to this decode: a graph recorded by one decode reads the same
        addresses in the next."""
        buckets = self.buckets or Buckets(max_batch=self.graphs.max_batch,
                                          length_step=self.graphs.length_step)
        if like is not None:
            layout = like.layout
        else:
            first = stack.blocks[0]
            layout = (first.kv_heads, first.head_dim, first.dtype, first.device, self.kv_store)
        size = (buckets.batch(batch), like.length if like is not None else buckets.length(length))
        key = (*size, self.layers, *layout, self.pad_id)
        if key not in self.graphs.buffers:
            self.graphs.buffers[key] = StepBuffers.allocate(*size, self.layers, *layout,
                                                            pad_id=self.pad_id)
        return self.graphs.buffers[key]
