"""A step's work for each request on the host: `turn` (its decision on its rows of the window,
`step.decide` then `step.resolve`, as an `Outcome`) and `draw` (the captured whole step's
sampling draws, made exactly as `turn` makes them, so captured tokens are eager's).

`Decoding.step` calls these; features plug in through the step's records and the executors,
never as copies of this code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from dllm_decode.consult import Consultant
from dllm_decode.interfaces import StepInput
from dllm_decode.ops import aligned_uniform
from dllm_decode.provisional import proposal
from dllm_decode.records import Outcome
from dllm_decode.running import Batch
from dllm_decode.step import Resolved, Window, decide, draws_past_block, resolve


def noise_span(batch: Batch, g: int) -> int:
    """Columns request `g` draws sampling noise for: its rows' regions to their block ends (to
    their generation ends under `step.draws_past_block`); its own rows only, so its draws do
    not depend on the batch, and no more than the step can use."""
    b, starts = batch.bounds, batch.region_starts()
    ends = b.gen_end if draws_past_block(batch.members[g].config) else b.end
    return max(ends[r] - starts[r] for r in batch.groups[g])


def draw(batch: Batch, uniform: Tensor, offset: int) -> None:
    """Each busy request's U(0, 1) draws for its rows (its generator, its rows' regions:
    `ops.aligned_uniform`, as `decide` draws them eagerly) into `uniform` (b, W, V), a window
    from canvas column `offset`."""
    for g, rows in batch.groups.items():
        if any(batch.bounds.busy[r] for r in rows):
            index = batch.phase.index[g]
            starts = batch.phase.region_start if index is None else batch.phase.region_start[index]
            draws = aligned_uniform(starts, noise_span(batch, g), offset, uniform.shape[1],
                                    batch.members[g].generator, uniform.shape[-1], uniform.dtype)
            uniform.copy_(draws) if index is None else uniform.index_copy_(0, index, draws)


def turn(batch: Batch, g: int, window: Window, *, model: Any, block_step: int,
         budgets: dict[int, int], eos_ids: tuple[int, ...], mask_id: int,
         report: Callable[[], Any], proposals: dict | None = None) -> Outcome:
    """Request `g`'s step (`step.decide`, its scheduler state threaded; `step.resolve`) and what
    its rows report. A rule that moves its block ends updates `budgets[g]`; `report()` is the
    cache's per-step counts, read when the request records a trace; a request keyed in
    `proposals` (a provisional stream) gets what this step proposed there."""
    member, index = batch.members[g], batch.phase.index[g]

    def rebound(ends: Tensor) -> tuple[Tensor, int]:       # a block start: one host read
        budgets[g] = batch.rebound(g, ends.tolist())
        block = batch.phase.block                          # a copy: the view may be kept
        return (block.clone() if index is None else block.index_select(0, index)), budgets[g]

    scheduler = member.config.scheduler
    consult = consultant(model, batch, index, member) if scheduler.lookahead_candidates or scheduler.guide else None
    inp, decision, nonfinite, member.state = decide(
        member.config, member.state, window.rows(index), step=block_step, num_steps=budgets[g],
        span=noise_span(batch, g), generator=member.generator, eos_ids=eos_ids, mask_id=mask_id,
        rebound=rebound, consult=consult)
    if consult is not None:                  # the rule's extra forwards, counted per row
        slots = batch.rows.slot if index is None else batch.rows.slot.index_select(0, index)
        member.nfe.index_add_(0, slots, consult.nfe)
        member.forward_rows.index_add_(0, slots, consult.forward_rows)
        member.guide_nfe.index_add_(0, slots, consult.guide_nfe)
    res = resolve(inp, decision, member.revises, budgeted=scheduler.step_budget(budgets[g]) is not None)
    if member.trace is not None:
        record(batch, g, inp, res, report())
    if proposals is not None and member.key in proposals:
        proposals[member.key] = proposal(inp, batch.bounds.gen_start[batch.groups[g][0]])
    revising = batch.phase.revising if index is None else batch.phase.revising[index]
    return Outcome.of(inp, decision, res, nonfinite, revising)


def consultant(model: Any, batch: Batch, index: Tensor | None, member: Any) -> Consultant:
    """The extra-forward runner (look-ahead, guide) over the canvases of batch rows `index`
    (the request's memory, the guide's prefix cache, kept on its member)."""
    rows = batch.rows
    pick = (lambda t: t) if index is None else (lambda t: t.index_select(0, index))   # noqa: E731
    return Consultant(model, pick(rows.x), None if rows.attention_mask is None
                      else pick(rows.attention_mask), member.memory)


def record(batch: Batch, g: int, inp: StepInput, res: Resolved, report: dict[str, Tensor] | None) -> None:
    """Request `g`'s trace entry for this step: its rows, the window offset (from its
    generation start), commits, tokens, confidences, revisions and the cache's report."""
    member, index = batch.members[g], batch.phase.index[g]
    pick = (lambda t: t) if index is None else (lambda t: t.index_select(0, index))   # noqa: E731
    entry = {"rows": pick(batch.rows.slot).cpu(),
             "offset": inp.offset - batch.bounds.gen_start[batch.groups[g][0]],
             "commit": res.commit.cpu(), "tokens": res.tokens.cpu(),
             "confidence": inp.confidence.cpu(), "block_step": inp.step}
    if member.revises != "none":
        entry.update(remask=res.remask.cpu(), edit=res.edit.cpu())
    if report is not None:         # per-step cache counts (refreshed layers, recomputed columns)
        entry["cache"] = {key: pick(value).cpu() for key, value in report.items()}
    member.trace.append(entry)
