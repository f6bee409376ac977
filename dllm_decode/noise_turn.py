"""A request's step on a uniform-noise canvas inside the one loop (`dllm_decode.canvas`).

Each request keeps its own encoder cache of its committed tokens (`NoiseRows.encoder`): its
prompt, then each committed canvas, encoded at the request's own positions, so its forward and
its draws never depend on its batch-mates. Per phase (one canvas) and per request: `forward` at
the phase's first step encodes what it committed since, draws the canvas's noise, and every step
denoises its current canvas (self-conditioned on its last tempered logits); `turn` tempers the
logits, samples, lets the request's scheduler accept columns (`select`, as on a masked canvas),
re-noises the rest, and applies the stop test. While the canvas runs nothing is committed (the
loop's canvas keeps the canvas kind's open marker there); when every row of the request stopped
or the step budget is spent, its argmax canvas is committed after the end-of-text rules
(`noise.finalize`), and when every row has ended its text the rest of the region is end of text.

Random draws, in the reference's order, all from the request's generator: per canvas one
`randint(0, V, (B, C))`, then per step one `multinomial` over the (B*C, V) float32 softmax of
the tempered logits and one `randint(0, V, (B, C))` for the re-noise (drawn whole, then masked).
So a request decoded with `torch.Generator().manual_seed(s)` on the CPU draws exactly what
transformers 5.24 `DiffusionGemmaForBlockDiffusion.generate` draws after `torch.manual_seed(s)`
on the same B prompts. As the reference does, a request's rows step (and draw) until all of
them stop: parity holds per request, and a request waits (no step, no draw) once its canvas is
committed while other requests of the batch still denoise theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig
from dllm_decode.noise import NoiseSchedule, finalize, schedule_of
from dllm_decode.provisional import Proposal
from dllm_decode.records import Outcome
from dllm_decode.running import Batch
from dllm_decode.step import Resolved, Window, step_input


@dataclass
class NoiseRows:
    """One request's noise canvas, its rows in batch order.

    Attributes:
        schedule: its steps, temperatures and stop test.
        eos, pad: its end-of-text ids (empty unless it stops at end of text) and the pad id
            that fills a row after its text ended (None: none).
        finished: (b,) rows whose text ended on an earlier canvas.
        encoder: the model's cache of the request's committed tokens; `seen` its columns.
        tokens: (b, C) what the canvas's uncommitted columns hold now (noise and accepted samples).
        argmax: (b, C) the last argmax canvas (committed when the canvas ends).
        condition: (b, C, V) the last tempered logits (the next step's self-conditioning).
        history: (S, b, C) the last S argmax canvases; done: (b,) rows stable and confident.
        remaining: the canvas's steps left.
        prefix: the prefix cache's side of its encoder passes (`encoder_reuse.RequestPrefix`;
            None: the model encodes without it).
    """

    schedule: NoiseSchedule
    eos: Tensor
    pad: int | None
    finished: Tensor
    encoder: Any = None
    seen: int = 0
    tokens: Tensor | None = None
    argmax: Tensor | None = None
    condition: Tensor | None = None
    history: Tensor | None = None
    done: Tensor | None = None
    remaining: int = 0
    prefix: Any = None

    @classmethod
    def of(cls, model: Any, config: DecodeConfig, rows: int, device: Any) -> NoiseRows:
        eos = model.eos_token_ids if config.stop_at_eos else ()
        return cls(schedule_of(config.scheduler, model), torch.tensor(eos, dtype=torch.long, device=device),
                   pad_of(model), torch.zeros(rows, dtype=torch.bool, device=device))


def pad_of(model: Any) -> int | None:
    """The pad id of the model's generation config (the reference pads after end of text)."""
    return (getattr(model, "generation_defaults", {}) or {}).get("pad_token_id")


def forward(model: Any, batch: Batch, span: tuple[int, int], block_step: int,
            denoise: Any = None) -> Tensor:
    """(b, hi - lo, V) float32 logits over the batch window `span`: each request still denoising
    gets its canvas's logits at its block's columns (its own forward over its own cache); zeros
    elsewhere, where no row may commit. `denoise`: the decoder forward (default `model.denoise`)."""
    lo, hi = span
    denoise = denoise or model.denoise
    out = None
    for g, rows in batch.groups.items():
        if not any(batch.bounds.busy[r] for r in rows):     # its canvas is committed: it waits
            continue
        if block_step == 0:
            start_canvas(model, batch, g)
        state, index = batch.members[g].noise, batch.phase.index[g]
        logits = denoise(state.tokens, state.encoder, state.condition)
        if out is None:
            out = logits.new_zeros(len(batch), hi - lo, logits.shape[-1])
        column = batch.bounds.start[rows[0]] - lo
        if index is None:
            out[:, column:column + logits.shape[1]] = logits
        else:
            out[index, column:column + logits.shape[1]] = logits
    return out


def start_canvas(model: Any, batch: Batch, g: int) -> None:
    """Request `g`'s canvas begins: what it committed since its last canvas is encoded (its
    prompt first, with its own padding), its noise drawn, its stop test and rule state reset."""
    member, rows, index = batch.members[g], batch.groups[g], batch.phase.index[g]
    state: NoiseRows = member.noise
    pick = (lambda t: t) if index is None else (lambda t: t.index_select(0, index))   # noqa: E731
    first = batch.rows.x.shape[1] - member.out.shape[1]     # the batch column of its column 0
    start, end = batch.bounds.start[rows[0]], batch.bounds.end[rows[0]]
    mask = None
    if state.encoder is None and batch.rows.attention_mask is not None:
        mask = pick(batch.rows.attention_mask)[:, first:start]
    ids = pick(batch.rows.x)[:, first + state.seen:start]
    if state.prefix is not None:               # through the prefix cache: its prompt after a stored prefix
        state.encoder = state.prefix.encode(model, member, ids, mask, state.encoder)
    else:
        state.encoder = model.encode(ids, mask, state.encoder)
    state.seen = start - first
    for count in (member.nfe, member.forward_rows):                           # the encoder pass
        count.index_add_(0, pick(batch.rows.slot), (~state.finished).long())
    b, device = len(rows), state.finished.device
    state.tokens = torch.randint(0, model.vocab_size, (b, end - start), generator=member.generator,
                                 device=device)
    state.argmax, state.condition, state.remaining = state.tokens, None, state.schedule.steps
    state.done = torch.zeros(b, dtype=torch.bool, device=device)
    state.history = torch.full((state.schedule.stability_threshold, b, end - start), -1,
                               dtype=torch.long, device=device)
    member.state = member.config.scheduler.init_state(b, device)


def turn(batch: Batch, g: int, window: Window, *, model: Any, block_step: int,
         budgets: dict[int, int], eos_ids: tuple[int, ...], mask_id: int, report: Any = None,
         proposals: dict | None = None) -> Outcome:
    """Request `g`'s step on its noise canvas (see the module docstring)."""
    member, rows, index = batch.members[g], batch.groups[g], batch.phase.index[g]
    state: NoiseRows = member.noise
    schedule, generator = state.schedule, member.generator
    if block_step == 0:
        budgets[g] = schedule.steps            # the canvas's step budget bounds the phase
    view = window.rows(index)
    column = batch.bounds.start[rows[0]] - window.offset
    b, width = state.tokens.shape
    raw = view.logits[:, column:column + width]
    z = raw / schedule.temperature(state.remaining).to(raw.device)
    probs = torch.softmax(z, -1, dtype=torch.float32)
    sample = torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=generator).view(b, width)
    inp = step_input(logits=z, probs=probs, candidates=sample, current=state.tokens,
                     is_masked=torch.ones_like(state.tokens, dtype=torch.bool),
                     step=schedule.steps - state.remaining, num_steps=schedule.steps,
                     generator=generator, eos_ids=eos_ids, mask_id=-1)
    decision, member.state = member.config.scheduler.select(inp, member.state)
    accept, tokens = decision.resolve(inp)
    fresh = torch.randint(0, model.vocab_size, (b, width), generator=generator, device=z.device)
    worked = ~(state.done | state.finished)
    stopped = state.done[:, None]               # a stopped row keeps its canvas, argmax and logits
    new_tokens = torch.where(stopped, state.tokens, torch.where(accept, tokens, fresh))
    argmax = torch.where(stopped, state.argmax, z.argmax(-1))
    if state.condition is not None:
        z = torch.where(stopped[..., None], state.condition, z)
    now, state.history = schedule.stop(state.history, argmax, z)
    state.done = state.done | now
    state.tokens, state.argmax, state.remaining = new_tokens, argmax, state.remaining - 1
    state.condition = z.to(model.model.decoder.embed_tokens.weight.dtype)
    ended = state.remaining == 0 or bool(state.done.all())
    if proposals is not None and member.key in proposals:    # the argmax canvas, while it runs
        start = window.offset + column - batch.bounds.gen_start[rows[0]]
        proposals[member.key] = Proposal(start, argmax.clone(), torch.full_like(argmax, not ended, dtype=torch.bool))
    return outcome(state, view, column, ended, worked, ~torch.isfinite(raw).all(-1).all(-1))


def outcome(state: NoiseRows, view: Window, column: int, ended: bool, worked: Tensor,
            nonfinite: Tensor) -> Outcome:
    """The step's writes: nothing while the canvas runs; its argmax canvas, after the end-of-text
    rules, once it ended (and the rest of the region is end of text when every row's text ended)."""
    commit = torch.zeros_like(view.tokens, dtype=torch.bool)
    tokens = torch.zeros_like(view.tokens)
    gen_end, truncates = view.gen_span[:, 1], False
    if ended:
        block, state.finished = finalize(state.argmax, state.finished, state.eos, state.pad)
        width = block.shape[1]
        commit[:, column:column + width] = True
        tokens[:, column:column + width] = block
        if bool(state.finished.all()):
            gen_end, truncates = view.block[:, 1], True
    none = torch.zeros_like(commit)
    return Outcome(Resolved(commit, tokens, none, none), worked, torch.zeros_like(worked), gen_end,
                   nonfinite, truncates)
