"""`generate`: the one masked-denoising loop. Schedulers, caches and filters plug into it.

Per step: get logits for the active window (cache), build the step's view (`StepInput`), let the
scheduler and then each filter decide, enforce the invariants, write the commits. The invariants
hold for every scheduler, once, here: commits lie in the masked part of the row's active block
(an "all-in" finish may fill every masked column it sees), every row with work commits at least
one token per step, [MASK] is never written, committed tokens never change, every block ends with
no masks, and a hard step cap turns a stuck block into an error instead of masked output.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.interfaces import Cache, Decision, DiffusionLM, Filter, StepInput
from dllm_decode.ops import argmax_mask, gumbel_argmax, masked_scores
from dllm_decode.prompts import encode_prompts, left_pad


@torch.inference_mode()
def generate(model: DiffusionLM, prompts: Sequence[str] | Sequence[Sequence[int]],
             config: DecodeConfig, *, cache: Cache | None = None, filters: Sequence[Filter] = (),
             generator: torch.Generator | None = None, tokenizer: Any = None,
             trace: bool = False) -> DecodeResult:
    """Decode a batch of prompts with masked denoising in semi-autoregressive blocks.

    Args:
        model: a DiffusionLM (see `dllm_decode.interfaces`).
        prompts: B strings (encoded with `tokenizer`, default `model.tokenizer`) or B token-id lists.
        config: scheduler, lengths, temperature, EOS policy.
        cache: how logits are obtained (default: a full forward every step).
        filters: applied after the scheduler, in order.
        generator: the only source of randomness (temperature > 0, random scores).
        tokenizer: for string prompts and decoded text.
        trace: record which positions were committed at which step with which confidence.
    Returns:
        A `DecodeResult`; batched output equals decoding each prompt alone (greedy).
    Raises:
        ValueError: empty prompt, prompt plus generation longer than the model's context.
    """
    started = time.perf_counter()
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    ids = encode_prompts(prompts, tokenizer)
    limit = getattr(model, "max_length", None)
    longest = max(len(row) for row in ids)
    if limit is not None and longest + config.gen_length > limit:
        raise ValueError(f"prompt ({longest} tokens) + gen_length ({config.gen_length}) exceeds the "
                         f"model's context of {limit} tokens")
    device = _device_of(model)
    eos_ids = tuple(model.eos_token_ids)
    canvas, attention_mask = left_pad(ids, config.gen_length, model.mask_token_id, eos_ids[0], device)
    run = _Run(model, config, cache, tuple(filters), generator, canvas, attention_mask, trace)
    run.decode()
    tokens = run.out[:, canvas.shape[1] - config.gen_length:].cpu()
    is_eos = torch.isin(tokens, torch.tensor(eos_ids))
    answer_lengths = torch.where(is_eos.any(-1), is_eos.int().argmax(-1), tokens.shape[1])
    text = None
    if tokenizer is not None:
        text = [tokenizer.decode(row[:n].tolist(), skip_special_tokens=True).strip()
                for row, n in zip(tokens, answer_lengths.tolist())]
    return DecodeResult(tokens=tokens, nfe=run.nfe.cpu(), answer_lengths=answer_lengths,
                        seconds=time.perf_counter() - started, text=text,
                        trace=run.trace if trace else None)


def _device_of(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device(getattr(model, "device", "cpu"))


class _Run:
    """State of one `generate` call. Working tensors hold only the rows still decoding."""

    def __init__(self, model, config: DecodeConfig, cache: Cache | None, filters: tuple[Filter, ...],
                 generator, canvas: Tensor, attention_mask: Tensor | None, trace: bool):
        self.model, self.config, self.cache, self.filters = model, config, cache, filters
        self.generator = generator
        self.mask_id = model.mask_token_id
        self.eos_ids = torch.tensor(tuple(model.eos_token_ids), device=canvas.device)
        batch, width = canvas.shape
        self.gen_start = width - config.gen_length
        self.out = canvas.clone()                       # finished rows are written back here
        self.x, self.attention_mask = canvas, attention_mask
        self.rows = torch.arange(batch, device=canvas.device)    # original index of each working row
        self.nfe = torch.zeros(batch, dtype=torch.long, device=canvas.device)   # counted on device
        self.gen_end = [width] * batch                  # shrinks under truncation (EoTP)
        self.start = [self.gen_start] * batch
        self.end = [self.gen_start] * batch
        self.wide = config.scheduler.view == "rest" or any(f.view == "rest" for f in filters)
        self.trace: list[dict[str, Any]] = []
        self.record = trace
        self.sched_state = config.scheduler.init_state(batch, canvas.device)
        self.cache_state = cache.init_state(model) if cache is not None else None
        self.columns = torch.arange(width, device=canvas.device)
        self.gen_region = self.columns >= self.gen_start
        self.mask_column = torch.tensor([self.mask_id], device=canvas.device)
        self._bounds_memo: dict[str, tuple[Any, Tensor]] = {}

    # -- phases: every working row decodes its next block; the phase ends when all are done --
    def decode(self) -> None:
        while self.x.shape[0]:
            self.start = list(self.end)
            self.end = [min(s + self.config.block_length, g) for s, g in zip(self.start, self.gen_end)]
            self.budget = self._block_budget()
            self._decode_block()

    def _decode_block(self) -> None:
        block_step = 0
        while True:
            inp, decision = self._decide(self._step_input(block_step), block_step)
            has_work, gen_end = self._apply(inp, decision)
            if self._bookkeep(has_work, gen_end):
                return
            block_step += 1
            if block_step > self.budget + 1:
                raise RuntimeError("a block still has masks after one step per position: a "
                                   "scheduler or filter broke the progress rule")

    def _logits(self, block_step: int) -> tuple[Tensor, int]:
        lo, hi = min(self.start), max(self.end)
        if self.cache is None:
            stop = self.x.shape[1] if self.wide else hi
            return self.model(self.x, self.attention_mask, rows=(lo, stop)), lo
        logits, offset, self.cache_state = self.cache.logits(
            self.model, self.x, self.attention_mask, (lo, hi), block_step, self.cache_state)
        if not self.wide and offset + logits.shape[1] > hi:
            logits = logits[:, :hi - offset]
        return logits, offset

    def _bounds(self, name: str, key: tuple, rows: Any) -> Tensor:
        """A (B, 2) device tensor of host-side bounds, rebuilt only when `key` changes (bounds
        change at block starts and row drops, not every step)."""
        cached = self._bounds_memo.get(name)
        if cached is None or cached[0] != key:
            cached = (key, torch.tensor(rows, dtype=torch.long, device=self.x.device))
            self._bounds_memo[name] = cached
        return cached[1]

    def _block(self) -> Tensor:
        """(B, 2) each working row's active block `[start, end)`."""
        return self._bounds("block", (tuple(self.start), tuple(self.end)), list(zip(self.start, self.end)))

    def _step_input(self, block_step: int) -> StepInput:
        logits, offset = self._logits(block_step)
        block = self._block()
        gen_span = self._bounds("gen_span", tuple(self.gen_end), [[self.gen_start, g] for g in self.gen_end])
        window = self.x[:, offset:offset + logits.shape[1]]
        is_masked = window == self.mask_id
        cols = self.columns[offset:offset + logits.shape[1]]
        eligible = is_masked & (cols >= block[:, :1]) & (cols < block[:, 1:])
        inp = self._view(logits, StepInput(
            step=block_step, num_steps=self.budget,
            offset=offset, block=block, gen_span=gen_span, is_masked=is_masked, eligible=eligible,
            candidates=window, confidence=eligible.float(), probs=logits, logits=logits,
            live=eligible.any(-1), generator=self.generator, eos_ids=tuple(self.model.eos_token_ids)))
        processed, self.sched_state = self.config.scheduler.process_logits(inp, self.sched_state)
        return inp if processed is None else self._view(processed, inp)

    def _view(self, logits: Tensor, inp: StepInput) -> StepInput:
        """Candidates and confidences from (processed) logits; [MASK] is never a candidate."""
        logits = logits.float().index_fill(-1, self.mask_column, torch.finfo(torch.float32).min)
        probs = logits.softmax(-1)
        candidates = gumbel_argmax(logits, self.config.temperature, self.generator)
        confidence = probs.gather(-1, candidates.unsqueeze(-1)).squeeze(-1)
        return dataclasses.replace(inp, logits=logits, probs=probs, candidates=candidates,
                                   confidence=masked_scores(confidence, inp.eligible))

    def _decide(self, inp: StepInput, block_step: int) -> tuple[StepInput, Decision]:
        scheduler = self.config.scheduler
        if block_step == 0:
            ends, self.sched_state = scheduler.block_end(inp, self.sched_state)
            if ends is not None:
                self.end = [max(s + 1, min(int(e), g)) for s, e, g in
                            zip(self.start, ends.tolist(), self.gen_end)]
                inp = self._rebound(inp)
        decision, self.sched_state = scheduler.select(inp, self.sched_state)
        for f in self.filters:
            decision = f(inp, decision)
        return inp, decision

    def _rebound(self, inp: StepInput) -> StepInput:
        block = self._block()
        eligible = inp.is_masked & ((inp.columns >= block[:, :1]) & (inp.columns < block[:, 1:]))
        confidence = masked_scores(inp.probs.gather(-1, inp.candidates.unsqueeze(-1)).squeeze(-1), eligible)
        self.budget = self._block_budget()
        return dataclasses.replace(inp, block=block, eligible=eligible, confidence=confidence,
                                   live=eligible.any(-1), num_steps=self.budget)

    def _block_budget(self) -> int:
        """The block's step budget, fixed when its bounds are set: a truncation (EoTP) inside the
        block shrinks the block but not the budget, so fixed-step schedules keep their per-step
        counts (and the step cap cannot fire on steps already taken)."""
        return max(e - s for s, e in zip(self.start, self.end))

    def _apply(self, inp: StepInput, decision: Decision) -> tuple[Tensor, Tensor]:
        """Enforce the invariants and write the commits. Returns (B,) rows that worked and gen ends."""
        tokens = inp.candidates if decision.tokens is None else decision.tokens
        commit = decision.commit & inp.eligible
        if decision.finish is not None:                 # all-in: every masked column in view
            commit = commit | (decision.finish.unsqueeze(-1) & inp.is_masked)
        commit = commit & (tokens != self.mask_id)
        stalled = inp.eligible.any(-1) & ~(commit & inp.eligible).any(-1)
        forced = argmax_mask(inp.confidence) & stalled.unsqueeze(-1)
        tokens = torch.where(forced, inp.candidates, tokens)
        commit = commit | forced
        window = self.x[:, inp.offset:inp.offset + commit.shape[1]]
        self.x[:, inp.offset:inp.offset + commit.shape[1]] = torch.where(commit, tokens, window)
        gen_end = inp.gen_span[:, 1]
        if decision.truncate_at is not None:
            gen_end = self._truncate(torch.minimum(gen_end, decision.truncate_at))
        if self.record:
            self.trace.append({"rows": self.rows.cpu(), "offset": inp.offset - self.gen_start,
                               "commit": commit.cpu(), "tokens": tokens.cpu(),
                               "confidence": inp.confidence.cpu(), "block_step": inp.step})
        finish = decision.finish if decision.finish is not None else torch.zeros_like(inp.live)
        return inp.live | finish, gen_end

    def _truncate(self, truncate_at: Tensor) -> Tensor:
        """Positions at or after `truncate_at` become end-of-text and are never attended again."""
        truncate_at = truncate_at.clamp_min(self.gen_start)
        cut = self.columns >= truncate_at.unsqueeze(-1)
        self.x = torch.where(cut, self.eos_ids[0], self.x)
        if self.attention_mask is None:
            self.attention_mask = torch.ones_like(self.x)
        self.attention_mask = self.attention_mask.masked_fill(cut, 0)
        return truncate_at

    def _bookkeep(self, has_work: Tensor, gen_end: Tensor) -> bool:
        """The step's single host sync; drops finished rows. Returns True when the phase is over."""
        block = self._block()
        in_block = (self.columns >= block[:, :1]) & (self.columns < block[:, 1:])
        still = self.x == self.mask_id
        self.nfe.index_add_(0, self.rows, has_work.long())
        block_left, gen_left, block_eos, gen_end = torch.stack([
            (still & in_block).any(-1).long(), (still & self.gen_region).any(-1).long(),
            (torch.isin(self.x, self.eos_ids) & in_block).any(-1).long(), gen_end,
        ]).tolist()                                      # the one host sync of the step
        self.gen_end = gen_end
        self.end = [min(e, g) for e, g in zip(self.end, gen_end)]
        eos_stop = [bool(self.config.stop_at_eos and not left and eos) for left, eos in zip(block_left, block_eos)]
        done = [not g or stop for g, stop in zip(gen_left, eos_stop)]
        if any(eos_stop):
            after = self.columns >= torch.tensor(self.end, device=self.x.device).unsqueeze(-1)
            stop_rows = torch.tensor(eos_stop, device=self.x.device).unsqueeze(-1)
            self.x = torch.where(after & stop_rows, self.eos_ids[0], self.x)
        if any(done):
            self._drop([i for i, d in enumerate(done) if d])
        return not any(left for left, d in zip(block_left, done) if not d)

    def _drop(self, finished: list[int]) -> None:
        gone = torch.tensor(finished, device=self.x.device)
        self.out[self.rows[gone]] = self.x[gone]
        keep_list = [i for i in range(self.x.shape[0]) if i not in set(finished)]
        keep = torch.tensor(keep_list, dtype=torch.long, device=self.x.device)
        self.x, self.rows = self.x[keep], self.rows[keep]
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask[keep]
        for name in ("start", "end", "gen_end"):
            setattr(self, name, [getattr(self, name)[i] for i in keep_list])
        self.sched_state = self.config.scheduler.select_rows(self.sched_state, keep)
        if self.cache is not None:
            self.cache_state = self.cache.select_rows(self.cache_state, keep)
