"""The step as data: the pure maths of one denoising step, with no batch, request or cache in it.

A step reads the batch's window (`Window`: the canvas columns the step has logits for, with the
rows' bounds), gives each request its view (`propose` draws the candidates, `step_input` builds
the `StepInput`, the one constructor there is), lets the request's scheduler and filters decide,
resolves the decision under the loop's rules (`resolve`), and writes the result into the window
(`write`) and the canvas tail (`truncate`). `Decoding` runs these on a live batch; the reference
loop, self-speculation, the draft-length rules and the exact theory run them on their own
canvases, so every one of them sees exactly the view a scheduler sees inside `generate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from dllm_decode.interfaces import Decision, StepInput
from dllm_decode.ops import gumbel_argmax, gumbel_noise, masked_scores, topk_mask

if TYPE_CHECKING:
    from dllm_decode.config import DecodeConfig

MAX_REVISIONS = 4
"""Times one column may be re-masked or edited; a column past it is final (revising policies
churn less, and every position is bounded, not only every block)."""


@dataclass(frozen=True)
class Window:
    """What every request's view of one step shares: the batch's window of canvas columns
    `[offset, offset + W)` with the model's logits for it and each row's bounds.

    Attributes:
        offset: canvas column of window column 0.
        logits: (b, W, V) the model's logits.
        tokens: (b, W) long, the window's tokens before the step ([MASK] where undecided).
        block: (b, 2) long, each row's active block `[start, end)`.
        gen_span: (b, 2) long, each row's generation region `[start, end)`.
        region_start: (b,) long, the first column each row may commit in (its block start, or
            its generation start under a rule that takes back earlier blocks).
        revisions: (b, W) int32 times each column was re-masked or edited, or None when no row
            of the batch revises.
        allowed: (b, W) bool, the only columns a row may commit in this step on top of its
            bounds (a token-shifted block model commits a block's first column alone), or None.
    """

    offset: int
    logits: Tensor
    tokens: Tensor
    block: Tensor
    gen_span: Tensor
    region_start: Tensor
    revisions: Tensor | None = None
    allowed: Tensor | None = None

    def rows(self, index: Tensor | None) -> Window:
        """The same window for the batch rows `index` (None: every row, `self`)."""
        if index is None:
            return self
        pick = lambda t: None if t is None else t.index_select(0, index)   # noqa: E731
        return Window(self.offset, pick(self.logits), pick(self.tokens), pick(self.block),
                      pick(self.gen_span), pick(self.region_start), pick(self.revisions),
                      pick(self.allowed))


def propose(logits: Tensor, mask_id: int, temperature: float = 0.0,
            generator: torch.Generator | None = None,
            region: tuple[Tensor, int, int] | None = None, noise: bool = False,
            uniform: Tensor | None = None) -> tuple[Tensor, ...]:
    """(B, W, V) logits -> float32 logits with [MASK] excluded, their softmax, and (B, W) candidate
    tokens (argmax, or a Gumbel-max sample at `temperature`). [MASK] is never a candidate.
    `region = (start, span, offset)` draws the sampling noise for each row's own columns
    `[start, start + span)` only (see `ops.gumbel_argmax`), so a row's draws do not depend on
    the window its batch happens to need. `noise=True` adds a fourth item: the (B, W, V)
    float64 noise `temperature * Gumbel` the candidates were drawn with (None at T = 0).
    `uniform`: the region's U(0, 1) draws made beforehand (`ops.aligned_uniform`; the captured
    step draws them on its host side, with the same generator, so its tokens are eager's)."""
    logits = logits.float().index_fill(-1, torch.tensor([mask_id], device=logits.device),
                                       torch.finfo(torch.float32).min)
    if not noise:
        return logits, logits.softmax(-1), gumbel_argmax(logits, temperature, generator, region, uniform)
    drawn = gumbel_noise(logits, temperature, generator, region, uniform)
    candidates = logits.argmax(-1) if drawn is None else (logits.double() + drawn).argmax(-1)
    return logits, logits.softmax(-1), candidates, drawn


def step_input(*, logits: Tensor | None = None, probs: Tensor | None = None,
               candidates: Tensor | None = None, confidence: Tensor | None = None,
               current: Tensor | None = None, is_masked: Tensor | None = None,
               block: Tensor | None = None, gen_span: Tensor | None = None, offset: int = 0,
               region_start: Tensor | None = None, exclude: Tensor | None = None,
               revisions: Tensor | None = None, step: int = 0, num_steps: int | None = None,
               generator: torch.Generator | None = None, eos_ids: tuple[int, ...] = (),
               mask_id: int = -1, noise: Tensor | None = None) -> StepInput:
    """The `StepInput` of a (B, W) window at canvas columns `[offset, offset + W)`: the one
    place a scheduler's view is built (the loop, the reference loop, self-speculation, the
    draft-length rules, the exact theory and the tests all come here).

    Args:
        logits, probs: (B, W, V); give either (probs are the softmax of logits, logits the log of
            probs) or both.
        candidates: (B, W) proposed tokens; default the argmax of `probs`.
        confidence: (B, W) score of each candidate; default its probability.
        current: (B, W) the window's tokens; `is_masked` defaults to `current == mask_id`.
        is_masked: (B, W) bool; default `current == mask_id`, or every column.
        block: (B, 2) each row's active block; default the whole window.
        gen_span: (B, 2) each row's generation region; default the whole window.
        region_start: (B,) first column a row may commit in; default its block start.
        exclude: (B, W) bool columns taken out of the region (neither eligible nor revisable).
        revisions: (B, W) times each column was revised: committed generated columns of the
            region under `MAX_REVISIONS` become `revisable`. None: nothing is revisable.
        step, num_steps: the step within the block and the block's budget (default its length).
        noise: (B, W, V) the candidates' sampling noise, for a rule with `needs_noise`.
    Derived: `eligible` (masked, in `[region_start, block end)`, not excluded), `confidence`
    (-inf where not eligible), `live` (rows with an eligible column), `revisable`.
    """
    if logits is None and probs is None:
        raise ValueError("step_input needs logits or probs (B, W, V)")
    if logits is None:
        logits = probs.clamp_min(1e-30).log()
    logits = logits.float()
    probs = logits.softmax(-1) if probs is None else probs.float()
    batch, width, _ = probs.shape
    device = probs.device
    if is_masked is None:
        is_masked = (current == mask_id) if current is not None else \
            torch.ones(batch, width, dtype=torch.bool, device=device)
    if block is None or gen_span is None:
        whole = torch.tensor([[offset, offset + width]], device=device).expand(batch, 2)
        block = whole if block is None else block
        gen_span = whole if gen_span is None else gen_span
    region_start = block[:, 0] if region_start is None else region_start
    columns = torch.arange(width, device=device) + offset      # offset: an int or a 0-d tensor
    in_region = (columns >= region_start.unsqueeze(-1)) & (columns < block[:, 1:])
    if exclude is not None:
        in_region = in_region & ~exclude
    eligible = is_masked & in_region
    if candidates is None:
        candidates = probs.argmax(-1)
    if confidence is None:
        confidence = probs.gather(-1, candidates.unsqueeze(-1)).squeeze(-1)
    revisable = torch.zeros_like(eligible)
    if revisions is not None:
        revisable = ~is_masked & in_region & (columns >= gen_span[:, :1]) & (revisions < MAX_REVISIONS)
    if num_steps is None:
        num_steps = int((block[:, 1] - block[:, 0]).max())
    return StepInput(step=step, num_steps=num_steps, offset=offset, block=block, gen_span=gen_span,
                     is_masked=is_masked, eligible=eligible, candidates=candidates,
                     confidence=masked_scores(confidence, eligible), probs=probs, logits=logits,
                     live=eligible.any(-1), current=current, revisable=revisable,
                     generator=generator, eos_ids=tuple(eos_ids), mask_id=mask_id, noise=noise,
                     excluded=exclude)


def draws_past_block(config: DecodeConfig) -> bool:
    """Whether a request's sampling draws run to its generation end (its rule or a filter looks
    past its block, its rule picks the block's end or reads the noise) rather than to its block
    end: the columns a block-view rule can commit in, the only ones whose samples it uses."""
    s = config.scheduler
    return s.view == "rest" or s.chooses_block_bounds or s.needs_noise or \
        any(f.view == "rest" for f in config.filters)


def decide(config: DecodeConfig, state: Any, window: Window, *, step: int, num_steps: int,
           span: int, generator: torch.Generator | None, eos_ids: tuple[int, ...], mask_id: int,
           rebound: Callable[[Tensor], tuple[Tensor, int]] | None,
           consult: Callable[[Any, StepInput, Any], tuple[StepInput, Any]] | None = None,
           uniform: Tensor | None = None) -> tuple[StepInput, Decision, Tensor, Any]:
    """One request's step on its rows of the window: its view, then its scheduler's hooks in
    order (`process_logits`; `block_end` at block step 0; `select`) and its filters.
    `consult(scheduler, inp, state)` (the loop's `dllm_decode.consult.Consultant`) runs the
    extra forwards a rule asks for (look-ahead, guide) just before `select` and adds their
    results to its view; None runs none.

    Sampling noise is drawn for each row's own region (`span` columns from its region start: to
    its block end, or its generation end under `draws_past_block`), never for the batch's
    window, so it does not depend on the batch. `rebound(ends)` applies
    block ends the scheduler chose and returns the rows' new (b, 2) blocks and step budget; None
    keeps the blocks (the captured whole step: its rules keep the default `block_end`, and its
    `step` is a 0-d tensor). `uniform`: the sampling draws, made beforehand (`propose`).
    Returns the view the decision was made on, the decision, (b,) rows whose model logits were
    not finite, and the scheduler's new state.
    """
    scheduler, block = config.scheduler, window.block
    revisions = window.revisions if scheduler.revises != "none" else None

    def view(logits: Tensor, probs: Tensor, candidates: Tensor, noise: Tensor | None = None) -> StepInput:
        return step_input(logits=logits, probs=probs, candidates=candidates, current=window.tokens,
                          block=block, gen_span=window.gen_span, offset=window.offset,
                          region_start=window.region_start, revisions=revisions, step=step,
                          exclude=None if window.allowed is None else ~window.allowed,
                          num_steps=num_steps, generator=generator, eos_ids=eos_ids, mask_id=mask_id,
                          noise=noise)

    def proposed(logits: Tensor) -> StepInput:
        return view(*propose(logits, mask_id, config.temperature, generator,
                             (window.region_start, span, window.offset), noise=scheduler.needs_noise,
                             uniform=uniform))

    inp = proposed(window.logits)
    nonfinite = inp.probs.gather(-1, inp.candidates.unsqueeze(-1)).squeeze(-1).isnan().any(-1)
    processed, state = scheduler.process_logits(inp, state)
    if processed is not None:
        inp = proposed(processed)
    if rebound is not None and step == 0:
        ends, state = scheduler.block_end(inp, state)
        if ends is not None:
            block, num_steps = rebound(ends)
            inp = view(inp.logits, inp.probs, inp.candidates, inp.noise)
    if consult is not None:
        inp, state = consult(scheduler, inp, state)
    decision, state = scheduler.select(inp, state)
    for f in config.filters:
        decision = f(inp, decision)
    return inp, decision, nonfinite, state


class Resolved(NamedTuple):
    """What the loop writes for one step, each (B, W) over the window: `commit` columns get
    `tokens`, `remask` columns return to [MASK], `edit` columns are overwritten with `tokens`."""

    commit: Tensor
    tokens: Tensor
    remask: Tensor
    edit: Tensor


def resolve(inp: StepInput, decision: Decision, revises: str = "none",
            budgeted: bool = False) -> Resolved:
    """The decision under the loop's rules: commits and tokens by `Decision.resolve`; under a
    revising rule (`revises` != "none") its re-masks and edits kept to `revisable` columns, an
    edit only where it changes the token (never to [MASK]), and at most (commits - 1) re-masks
    per row, the least supported token first, so every step still leaves one mask fewer.
    `budgeted` (a rule with a `step_budget`): no forced progress and no re-mask clamp; the
    budget bounds the block instead."""
    commit, tokens = decision.resolve(inp, force=not budgeted)
    none = torch.zeros_like(commit)
    if revises == "none":
        return Resolved(commit, tokens, none, none)
    remask = none if decision.remask is None else decision.remask & inp.revisable
    edit = none if decision.edit is None else (
        decision.edit & inp.revisable & ~remask & (tokens != inp.current) & (tokens != inp.mask_id))
    support = inp.probs.gather(-1, inp.current.unsqueeze(-1)).squeeze(-1)
    allowed = torch.full_like(commit[:, 0], commit.shape[1], dtype=torch.long) if budgeted else \
        (commit.sum(-1) - 1).clamp_min(0)
    return Resolved(commit, tokens, topk_mask(masked_scores(-support, remask), allowed), edit)


def write(current: Tensor, resolved: Resolved, mask_id: int) -> Tensor:
    """(B, W) the window's tokens after the step: commits and edits written, re-masks undone."""
    changed = resolved.commit | resolved.edit
    return torch.where(changed, resolved.tokens, current).masked_fill(resolved.remask, mask_id)


def truncate(x: Tensor, attention_mask: Tensor | None, gen_end: Tensor, gen_start: Tensor,
             pad_id: int) -> tuple[Tensor, Tensor]:
    """(B, L) canvas and attention mask with every column at or after a row's `gen_end` (clamped
    to its `gen_start`) made `pad_id` (end-of-text) and never attended again."""
    columns = torch.arange(x.shape[1], device=x.device)
    cut = columns >= gen_end.clamp_min(gen_start).unsqueeze(-1)
    mask = torch.ones_like(x) if attention_mask is None else attention_mask
    return torch.where(cut, pad_id, x), mask.masked_fill(cut, 0)

