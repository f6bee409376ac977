"""`generate`: the one masked-denoising loop. Schedulers, caches and filters plug into it.

`Decoding` holds one batch of requests and advances it one denoising step at a time; `generate`
steps it to the end. Per step: the cache gives logits for the active window, the step's view
(`StepInput`) is built, the scheduler and then each filter decide, `Decision.resolve` applies the
loop's rules, the commits are written, and one host sync updates the bookkeeping. The invariants
hold for every scheduler, once, here: commits lie in the masked part of the row's active block
(an "all-in" finish may fill every masked column it sees), every row with work commits at least
one token per step, [MASK] is never written, committed tokens change only under a scheduler that
declares `revises` (then only inside its scope, and every step still leaves one mask fewer),
every block ends with no masks, and a hard step cap turns a stuck block into an error instead of
masked output.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.interfaces import Decision, DiffusionLM, StepInput
from dllm_decode.ops import gumbel_argmax, masked_scores, topk_mask
from dllm_decode.prompts import encode_prompts, left_pad


MAX_REVISIONS = 4
"""Times one column may be re-masked or edited; a column past it is final (revising policies
churn less, and every position is bounded, not only every block)."""


@torch.inference_mode()
def generate(model: DiffusionLM, prompts: Sequence[str] | Sequence[Sequence[int]],
             config: DecodeConfig, *, generator: torch.Generator | None = None,
             tokenizer: Any = None, trace: bool = False) -> DecodeResult:
    """Decode a batch of prompts with masked denoising in semi-autoregressive blocks.

    Args:
        model: a DiffusionLM (see `dllm_decode.interfaces`).
        prompts: B strings (encoded with `tokenizer`, default `model.tokenizer`) or B token-id lists.
        config: scheduler, cache, filters, lengths, temperature, EOS policy, seed.
        generator: the only source of randomness (temperature > 0, random scores); default a
            generator seeded with `config.seed`.
        tokenizer: for string prompts and decoded text.
        trace: record which positions were committed at which step with which confidence.
    Returns:
        A `DecodeResult`; batched output equals decoding each prompt alone (greedy).
    Raises:
        ValueError: empty prompt, prompt plus generation longer than the model's context.
    """
    decoding = Decoding(model, prompts, config, generator=generator, tokenizer=tokenizer, trace=trace)
    while not decoding.finished:
        decoding.step()
    return decoding.result()


@dataclass
class _Rows:
    """Tensors of the rows still decoding; a finished row leaves (its canvas is kept in `out`)."""

    x: Tensor                        # (b, L) canvas
    attention_mask: Tensor | None    # (b, L), None while no row is padded or truncated
    index: Tensor                    # (b,) the row's place in the request batch
    revisions: Tensor | None = None  # (b, L) times each column was re-masked or edited

    def keep(self, kept: Tensor) -> _Rows:
        mask = None if self.attention_mask is None else self.attention_mask[kept]
        revisions = None if self.revisions is None else self.revisions[kept]
        return _Rows(self.x[kept], mask, self.index[kept], revisions)

    def trim(self, width: int) -> _Rows:
        """Keep the first `width` canvas columns."""
        mask = None if self.attention_mask is None else self.attention_mask[:, :width]
        revisions = None if self.revisions is None else self.revisions[:, :width]
        return _Rows(self.x[:, :width], mask, self.index, revisions)


@dataclass
class _Blocks:
    """Host-side bounds of the rows still decoding: the active block `[start, end)` and the end
    of the generation region (it shrinks when a row is truncated)."""

    start: list[int]
    end: list[int]
    gen_end: list[int]
    post: list[int]                  # edit passes a row made after its block was full
    revising: list[bool]             # the row runs another edit pass before its block is done

    def advance(self, block_length: int) -> None:
        """Every row moves on to its next block."""
        self.start = list(self.end)
        self.end = [min(s + block_length, g) for s, g in zip(self.start, self.gen_end)]
        self.post = [0] * len(self.start)
        self.revising = [False] * len(self.start)

    def keep(self, kept: list[int]) -> _Blocks:
        return _Blocks(*([values[i] for i in kept] for values in
                         (self.start, self.end, self.gen_end, self.post, self.revising)))

    @property
    def budget(self) -> int:
        """The phase's step budget, fixed when the bounds are set: a truncation inside a block
        shrinks the block but not the budget, so fixed-step schedules keep their per-step counts
        (and the step cap cannot fire on steps already taken)."""
        return max(e - s for s, e in zip(self.start, self.end))


class Decoding:
    """One batch of requests under one `DecodeConfig`, advanced by `step()` until `finished`.

    All rows decode their current block in lockstep (a phase); a row whose block is done waits,
    with no eligible column, for the others. Rows leave the batch when their generation region
    has no mask left or when they stop at an end-of-text token.
    """

    def __init__(self, model: DiffusionLM, prompts: Sequence[str] | Sequence[Sequence[int]],
                 config: DecodeConfig, *, generator: torch.Generator | None = None,
                 tokenizer: Any = None, trace: bool = False):
        self.started = time.perf_counter()
        self.model, self.config = model, config
        self.tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        ids = encode_prompts(prompts, self.tokenizer)
        limit = getattr(model, "max_length", None)
        longest = max(len(row) for row in ids)
        if limit is not None and longest + config.gen_length > limit:
            raise ValueError(f"prompt ({longest} tokens) + gen_length ({config.gen_length}) exceeds "
                             f"the model's context of {limit} tokens")
        device = _device_of(model)
        self.eos_ids = tuple(model.eos_token_ids)
        self.eos = torch.tensor(self.eos_ids, device=device)
        canvas, attention_mask = left_pad(ids, config.gen_length, model.mask_token_id, self.eos_ids[0],
                                          device)
        batch, width = canvas.shape
        self.gen_start = width - config.gen_length
        self.generator = generator if generator is not None else \
            torch.Generator(device=device).manual_seed(config.seed)
        self.out = canvas.clone()                            # every row's final canvas
        self.nfe = torch.zeros(batch, dtype=torch.long, device=device)     # counted on device
        self.scope = config.scheduler.revises
        revisions = None if self.scope == "none" else torch.zeros_like(canvas, dtype=torch.int32)
        self.rows = _Rows(canvas, attention_mask, torch.arange(batch, device=device), revisions)
        self.blocks = _Blocks([self.gen_start] * batch, [self.gen_start] * batch, [width] * batch,
                              [0] * batch, [False] * batch)
        self.block_step = 0
        self.budget = 0
        self.wide = config.scheduler.view == "rest" or any(f.view == "rest" for f in config.filters)
        self.scheduler_state = config.scheduler.init_state(batch, device)
        self.cache_state = config.cache.init_state(model)
        self.columns = torch.arange(width, device=device)
        self.trimmable = bool(getattr(model, "trimmable", False))
        self.mask_column = torch.tensor([model.mask_token_id], device=device)
        self.trace: list[dict[str, Any]] | None = [] if trace else None
        self._memo: dict[str, tuple[Any, Tensor]] = {}

    @property
    def finished(self) -> bool:
        return self.rows.x.shape[0] == 0

    def step(self) -> None:
        """One denoising step of every row still decoding (one forward pass)."""
        if self.block_step == 0:
            self.blocks.advance(self.config.block_length)
            self.budget = self.blocks.budget
        inp = self._step_input()
        inp, decision = self._decide(inp)
        worked, edited, gen_end = self._write(inp, decision)
        self._bookkeep(worked, edited, gen_end)

    def snapshot(self) -> tuple[Tensor, Tensor]:
        """The requests' generation regions as they stand, on the CPU (one host transfer): (B, G)
        tokens ([MASK] where undecided) and (B,) the length of each row's final prefix, the
        answer tokens no later step can change (up to its first masked column). Servers stream
        that prefix while the request decodes."""
        canvas = self.out.clone()
        self._store(canvas, self.rows.index, self.rows.x)
        tokens = canvas[:, self.gen_start:].cpu()
        masked = tokens == self.model.mask_token_id
        final = torch.where(masked.any(-1), masked.int().argmax(-1), tokens.shape[1])
        return tokens, final

    def result(self) -> DecodeResult:
        tokens = self.out[:, self.gen_start:].cpu()
        is_eos = torch.isin(tokens, torch.tensor(self.eos_ids))
        answer_lengths = torch.where(is_eos.any(-1), is_eos.int().argmax(-1), tokens.shape[1])
        text = None
        if self.tokenizer is not None:
            text = [self.tokenizer.decode(row[:n].tolist(), skip_special_tokens=True).strip()
                    for row, n in zip(tokens, answer_lengths.tolist())]
        return DecodeResult(tokens=tokens, nfe=self.nfe.cpu(), answer_lengths=answer_lengths,
                            seconds=time.perf_counter() - self.started, text=text, trace=self.trace)

    # -- tensor work ---------------------------------------------------------------------------

    def _logits(self) -> tuple[Tensor, int]:
        """Logits for the active window: the phase's blocks, or everything after the earliest
        block start for `view = "rest"` rules (where the cache computed it)."""
        lo = self.gen_start if self.scope == "generated" else min(self.blocks.start)
        hi = max(self.blocks.end)
        logits, offset, self.cache_state = self.config.cache.logits(
            self.model, self.rows.x, self.rows.attention_mask, (lo, hi), self.block_step,
            self.cache_state)
        if not self.wide and offset + logits.shape[1] > hi:
            logits = logits[:, :hi - offset]
        return logits, offset

    def _bounds(self, name: str, key: tuple, value: Any) -> Tensor:
        """A (b, 2) device tensor of host-side bounds, rebuilt only when `key` changes (bounds
        change at block starts and row drops, not every step)."""
        cached = self._memo.get(name)
        if cached is None or cached[0] != key:
            cached = (key, torch.tensor(value, dtype=torch.long, device=self.rows.x.device))
            self._memo[name] = cached
        return cached[1]

    def _block(self) -> Tensor:
        """(b, 2) each row's active block `[start, end)`."""
        b = self.blocks
        return self._bounds("block", (tuple(b.start), tuple(b.end)), list(zip(b.start, b.end)))

    def _step_input(self) -> StepInput:
        logits, offset = self._logits()
        block = self._block()
        gen_end = self.blocks.gen_end
        gen_span = self._bounds("gen_span", tuple(gen_end), [[self.gen_start, g] for g in gen_end])
        window = self.rows.x[:, offset:offset + logits.shape[1]]
        is_masked = window == self.model.mask_token_id
        columns = self.columns[offset:offset + logits.shape[1]]
        region_start = self.gen_start if self.scope == "generated" else block[:, :1]
        in_region = (columns >= region_start) & (columns < block[:, 1:])
        eligible = is_masked & in_region
        revisable = torch.zeros_like(eligible)
        if self.scope != "none":
            revisions = self.rows.revisions[:, offset:offset + logits.shape[1]]
            revisable = ~is_masked & in_region & (columns >= self.gen_start) & (revisions < MAX_REVISIONS)
        inp = self._view(logits, StepInput(
            step=self.block_step, num_steps=self.budget, offset=offset, block=block,
            gen_span=gen_span, is_masked=is_masked, eligible=eligible, candidates=window,
            confidence=eligible.float(), probs=logits, logits=logits, live=eligible.any(-1),
            current=window.clone(), revisable=revisable, generator=self.generator,
            eos_ids=self.eos_ids, mask_id=self.model.mask_token_id))
        processed, self.scheduler_state = self.config.scheduler.process_logits(inp, self.scheduler_state)
        return inp if processed is None else self._view(processed, inp)

    def _view(self, logits: Tensor, inp: StepInput) -> StepInput:
        """Candidates and confidences from (processed) logits; [MASK] is never a candidate."""
        logits = logits.float().index_fill(-1, self.mask_column, torch.finfo(torch.float32).min)
        probs = logits.softmax(-1)
        candidates = gumbel_argmax(logits, self.config.temperature, self.generator)
        confidence = probs.gather(-1, candidates.unsqueeze(-1)).squeeze(-1)
        return dataclasses.replace(inp, logits=logits, probs=probs, candidates=candidates,
                                   confidence=masked_scores(confidence, inp.eligible))

    def _decide(self, inp: StepInput) -> tuple[StepInput, Decision]:
        scheduler = self.config.scheduler
        if self.block_step == 0:
            ends, self.scheduler_state = scheduler.block_end(inp, self.scheduler_state)
            if ends is not None:
                b = self.blocks
                b.end = [max(s + 1, min(int(e), g)) for s, e, g in zip(b.start, ends.tolist(), b.gen_end)]
                self.budget = b.budget
                inp = self._rebound(inp)
        decision, self.scheduler_state = scheduler.select(inp, self.scheduler_state)
        for f in self.config.filters:
            decision = f(inp, decision)
        return inp, decision

    def _rebound(self, inp: StepInput) -> StepInput:
        """The step's view with the block ends a scheduler just chose."""
        block = self._block()
        region_start = self.gen_start if self.scope == "generated" else block[:, :1]
        in_region = (inp.columns >= region_start) & (inp.columns < block[:, 1:])
        eligible = inp.is_masked & in_region
        confidence = masked_scores(inp.probs.gather(-1, inp.candidates.unsqueeze(-1)).squeeze(-1), eligible)
        return dataclasses.replace(inp, block=block, eligible=eligible, confidence=confidence,
                                   live=eligible.any(-1), num_steps=self.budget,
                                   revisable=inp.revisable & in_region)

    def _write(self, inp: StepInput, decision: Decision) -> tuple[Tensor, Tensor, Tensor]:
        """Write the resolved commits and revisions. Returns (b,) rows that worked, rows that
        edited, and their generation ends."""
        commit, tokens = decision.resolve(inp)
        x = self.rows.x
        columns = slice(inp.offset, inp.offset + commit.shape[1])
        written = torch.where(commit, tokens, inp.current)
        remask = edit = None
        if self.scope != "none":
            remask, edit = self._revisions(inp, decision, commit, tokens)
            written = torch.where(edit, tokens, written).masked_fill(remask, self.model.mask_token_id)
            self.rows.revisions[:, columns] += (remask | edit).int()
        x[:, columns] = written
        gen_end = inp.gen_span[:, 1]
        if decision.truncate_at is not None:
            gen_end = self._truncate(torch.minimum(gen_end, decision.truncate_at))
        if self.trace is not None:
            entry = {"rows": self.rows.index.cpu(), "offset": inp.offset - self.gen_start,
                     "commit": commit.cpu(), "tokens": tokens.cpu(),
                     "confidence": inp.confidence.cpu(), "block_step": inp.step}
            if remask is not None:
                entry.update(remask=remask.cpu(), edit=edit.cpu())
            self.trace.append(entry)
        finish = decision.finish if decision.finish is not None else torch.zeros_like(inp.live)
        edited = torch.zeros_like(inp.live) if edit is None else edit.any(-1)
        revising = self._bounds("revising", tuple(self.blocks.revising), self.blocks.revising).bool()
        return inp.live | finish | revising, edited, gen_end

    def _revisions(self, inp: StepInput, decision: Decision, commit: Tensor,
                   tokens: Tensor) -> tuple[Tensor, Tensor]:
        """The re-masks and edits the loop accepts: inside the scheduler's scope, edits that change
        a token, and at most (commits - 1) re-masks per row, the least supported token (lowest
        probability of its current value) first, so a block always ends."""
        none = torch.zeros_like(commit)
        remask = none if decision.remask is None else decision.remask & inp.revisable
        edit = none if decision.edit is None else (
            decision.edit & inp.revisable & ~remask & (tokens != inp.current) & (tokens != inp.mask_id))
        support = inp.probs.gather(-1, inp.current.unsqueeze(-1)).squeeze(-1)
        allowed = (commit.sum(-1) - 1).clamp_min(0)
        remask = topk_mask(masked_scores(-support, remask), allowed)
        return remask, edit

    def _truncate(self, truncate_at: Tensor) -> Tensor:
        """Columns at or after `truncate_at` become end-of-text and are never attended again."""
        truncate_at = truncate_at.clamp_min(self.gen_start)
        cut = self.columns >= truncate_at.unsqueeze(-1)
        rows = self.rows
        rows.x = torch.where(cut, self.eos_ids[0], rows.x)
        mask = torch.ones_like(rows.x) if rows.attention_mask is None else rows.attention_mask
        rows.attention_mask = mask.masked_fill(cut, 0)
        return truncate_at

    # -- host bookkeeping ----------------------------------------------------------------------

    def _bookkeep(self, worked: Tensor, edited: Tensor, gen_end: Tensor) -> None:
        """The step's single host sync: count forwards, stop rows at end-of-text, drop finished
        rows, and end the phase when no row has a mask left in its block (or an edit pass to run)."""
        rows, blocks = self.rows, self.blocks
        block = self._block()
        region_start = self.gen_start if self.scope == "generated" else block[:, :1]
        in_block = (self.columns >= region_start) & (self.columns < block[:, 1:])
        still = rows.x == self.model.mask_token_id
        self.nfe.index_add_(0, rows.index, worked.long())
        block_left, gen_left, block_eos, edits, gen_end_list = torch.stack([
            (still & in_block).any(-1).long(), (still & (self.columns >= self.gen_start)).any(-1).long(),
            (torch.isin(rows.x, self.eos) & in_block).any(-1).long(), edited.long(), gen_end,
        ]).tolist()                                      # the one host sync of the step
        blocks.gen_end = gen_end_list
        blocks.end = [min(e, g) for e, g in zip(blocks.end, gen_end_list)]
        if self.config.scheduler.post_steps:
            self._post_fill(block_left, edits)
        revising = blocks.revising
        stops = [bool(self.config.stop_at_eos and not left and eos and not rev)
                 for left, eos, rev in zip(block_left, block_eos, revising)]
        if any(stops):                     # the rest of a stopped row is end-of-text
            after = self.columns >= torch.tensor(blocks.end, device=rows.x.device).unsqueeze(-1)
            stopped = torch.tensor(stops, device=rows.x.device).unsqueeze(-1)
            rows.x = torch.where(after & stopped, self.eos_ids[0], rows.x)
        done = [(not left and not rev) or stop for left, rev, stop in zip(gen_left, revising, stops)]
        phase_over = not any(left or rev for left, rev, d in zip(block_left, revising, done) if not d)
        if any(done):
            self._drop(done)
        if self.trimmable and not self.finished:
            self._trim(max(self.blocks.gen_end))
        self.block_step = 0 if phase_over else self.block_step + 1
        if self.block_step > self.budget + self.config.scheduler.post_steps + 1:
            raise RuntimeError("a block still has masks after one step per position: a scheduler "
                               "or filter broke the progress rule")

    def _post_fill(self, block_left: list[int], edits: list[int]) -> None:
        """Edit passes after a row's block is full (token editing): one follows the step that
        filled the block and each pass that edited, up to the scheduler's `post_steps`."""
        blocks, budget = self.blocks, self.config.scheduler.post_steps
        for r, (left, edited) in enumerate(zip(block_left, edits)):
            ran_post = blocks.revising[r]
            blocks.post[r] += ran_post
            blocks.revising[r] = bool(not left and blocks.post[r] < budget and (edited or not ran_post))

    def _trim(self, width: int) -> None:
        """Cut the canvas columns no live row attends any more (every row truncated before them),
        so the cost of a forward follows the live canvas. Exact: those columns were already
        masked out of attention."""
        if width >= self.rows.x.shape[1]:
            return
        self.rows = self.rows.trim(width)
        self.columns = self.columns[:width]
        self.cache_state = self.config.cache.trim(self.cache_state, width)
        self._memo.clear()

    def _store(self, canvas: Tensor, index: Tensor, x: Tensor) -> None:
        """Write rows into full-width `canvas` slots; a trimmed tail is end-of-text."""
        canvas[index, :x.shape[1]] = x
        canvas[index, x.shape[1]:] = self.eos_ids[0]

    def _drop(self, done: list[bool]) -> None:
        """Finished rows leave the batch; their canvases go to `out` in their request slots."""
        gone = torch.tensor([i for i, d in enumerate(done) if d], device=self.rows.x.device)
        self._store(self.out, self.rows.index[gone], self.rows.x[gone])
        kept_list = [i for i, d in enumerate(done) if not d]
        kept = torch.tensor(kept_list, dtype=torch.long, device=self.rows.x.device)
        self.rows = self.rows.keep(kept)
        self.blocks = self.blocks.keep(kept_list)
        self.scheduler_state = self.config.scheduler.select_rows(self.scheduler_state, kept)
        self.cache_state = self.config.cache.select_rows(self.cache_state, kept)


def _device_of(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device(getattr(model, "device", "cpu"))
