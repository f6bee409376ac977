"""`generate`: the one masked-denoising loop. Schedulers, caches and filters plug into it.

`Decoding` holds a running batch and advances it one denoising step at a time; `generate` adds
one request and steps it to the end, and a server adds requests as they come (they join between
blocks and leave when they finish). Per step: the cache gives logits for the active window, each
request's rows get their view (`StepInput`), its scheduler and then its filters decide,
`Decision.resolve` applies the loop's rules, the commits are written, and one host sync updates
the bookkeeping. The invariants hold for every scheduler, once, here: commits lie in the masked
part of the row's active block (an "all-in" finish may fill every masked column it sees), every
row with work commits at least one token per step, [MASK] is never written, committed tokens
change only under a scheduler that declares `revises` (then only inside its scope, and every step
still leaves one mask fewer), every block ends with no masks, and a hard step cap turns a stuck
block into an error instead of masked output.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from dllm_decode.batch import Bounds, Request, Rows
from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.errors import NonFiniteLogits
from dllm_decode.interfaces import Cache, Decision, DiffusionLM, StepInput
from dllm_decode.models.block_grid import block_start_columns, grid_canvas
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
        TypeError: an argument of the wrong kind (named in the message).
        ValueError: empty prompt, a token id outside the vocabulary, prompt plus generation
            longer than the model's context.
        NonFiniteLogits: the model produced NaN or infinite logits (a model problem).
    """
    if not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
    decoding = Decoding(model, config.cache, trace=trace)
    key = decoding.add(prompts, config, generator=generator, tokenizer=tokenizer)
    while not decoding.finished:
        decoding.step()
    return decoding.result(key)


class UnknownRequest(KeyError, ValueError):
    """A `Decoding` call named a request key it cannot answer for (unknown, taken, or not yet
    finished). A `ValueError` like every bad argument, and a `KeyError` as before."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Decoding:
    """A running batch: requests (each its own config, generator and lengths) decoded together
    with one cache, advanced by `step()`.

    All rows decode their current block in lockstep (a phase); a row whose block is done waits,
    with no eligible column, for the others. Requests added with `add` join at the next phase
    boundary. Rows leave when their generation region has no mask left or when they stop at an
    end-of-text token; a request is done when its last row leaves (`step` returns its key and
    `result(key)` its `DecodeResult`). A request's output does not depend on what else is in the
    batch (greedy; and with sampling too, since each draws from its own generator).
    """

    def __init__(self, model: DiffusionLM, cache: Cache, *, trace: bool = False):
        missing = [a for a in ("mask_token_id", "eos_token_ids", "vocab_size", "forward")
                   if not hasattr(model, a)]
        if missing:
            raise TypeError(f"model must be a DiffusionLM (dllm_decode.interfaces); "
                            f"{type(model).__name__} lacks {missing}")
        if not isinstance(cache, Cache):
            raise TypeError(f"cache must be a Cache instance, got {type(cache).__name__}")
        if not isinstance(trace, bool):
            raise TypeError(f"trace must be True or False, got {type(trace).__name__} {trace!r}")
        self.model, self.cache, self.trace = model, cache, trace
        cache.init_state(model)              # a cache that cannot serve this model says so now
        self.device = _device_of(model)
        self.mask_id = model.mask_token_id
        self.eos_ids = tuple(model.eos_token_ids)
        self.eos = torch.tensor(self.eos_ids, device=self.device)
        self.trimmable = bool(getattr(model, "trimmable", False))
        self.grid: int | None = getattr(model, "block_size", None)     # block-causal models
        self.requests: list[Request] = []
        self.pending: list[tuple[Request, Tensor, Tensor | None, list]] = []   # request, canvas, mask, ids
        self.results: dict[Hashable, Request] = {}
        self.rows: Rows | None = None
        self.bounds = Bounds()
        self.cache_state: Any = None
        self.block_step = 0
        self.budgets: dict[int, int] = {}
        self._memo: dict[str, tuple[Any, Tensor]] = {}

    # -- requests ------------------------------------------------------------------------------

    def add(self, prompts: Sequence[str] | Sequence[Sequence[int]], config: DecodeConfig, *,
            generator: torch.Generator | None = None, tokenizer: Any = None,
            key: Hashable | None = None) -> Hashable:
        """Queue a request; it joins the batch at the next phase boundary. Returns its key.

        Raises:
            ValueError: empty prompt, prompt plus generation longer than the model's context, a
                cache other than this batch's, or a key already in use.
        """
        if not isinstance(config, DecodeConfig):
            raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if config.cache != self.cache:
            raise ValueError(f"this batch decodes with cache {self.cache!r}; a request with "
                             f"{config.cache!r} needs a batch of its own")
        if self.grid is not None and (self.grid % config.block_length or config.scheduler.chooses_block_bounds):
            raise ValueError(f"this block-diffusion model decodes blocks of {self.grid} positions: "
                             f"block_length must divide {self.grid} (sub-blocks; got "
                             f"{config.block_length}) and the scheduler cannot choose block bounds")
        key = key if key is not None else len(self.requests) + len(self.pending) + len(self.results)
        if any(r.key == key for r in [*self.requests, *(p[0] for p in self.pending)]) or key in self.results:
            raise ValueError(f"request key {key!r} is already in use")
        if tokenizer is not None and not (callable(tokenizer) and hasattr(tokenizer, "decode")):
            raise TypeError(f"tokenizer must be a tokenizer (callable, with decode), got "
                            f"{type(tokenizer).__name__} {tokenizer!r}")
        tokenizer = tokenizer if tokenizer is not None else getattr(self.model, "tokenizer", None)
        ids = encode_prompts(prompts, tokenizer, self.model.vocab_size, self.mask_id)
        config.scheduler.check_fits(int(self.model.vocab_size), config.gen_length)
        limit = getattr(self.model, "max_length", None)
        longest = max(len(row) for row in ids)
        if limit is not None and longest + config.gen_length > limit:
            raise ValueError(f"prompt ({longest} tokens) + gen_length ({config.gen_length}) exceeds "
                             f"the model's context of {limit} tokens")
        canvas, mask = left_pad(ids, config.gen_length, self.mask_id, self.eos_ids[0], self.device)
        generator = generator if generator is not None else \
            torch.Generator(device=self.device).manual_seed(config.seed)
        request = Request(key, config, generator, tokenizer, out=canvas.clone(),
                          nfe=torch.zeros(canvas.shape[0], dtype=torch.long, device=self.device),
                          trace=[] if self.trace else None, live=canvas.shape[0])
        # block-diffusion models decode whole blocks of their grid; `out` keeps the G asked for
        canvas, mask = grid_canvas(self.model, canvas, mask, [len(row) for row in ids],
                                   config.gen_length, self.mask_id, self.eos_ids[0])
        self.pending.append((request, canvas, mask, ids))
        return key

    @property
    def finished(self) -> bool:
        """No row decoding and none waiting to join."""
        return not self.pending and (self.rows is None or self.rows.x.shape[0] == 0)

    def result(self, key: Hashable) -> DecodeResult:
        """The finished request's result (tokens, text, NFE, seconds, trace), handed over once.

        Raises:
            KeyError: no finished request has that key (still decoding, cancelled, or taken).
        """
        if key not in self.results:
            raise self._missing(key, "has no result yet: it is still decoding (call step() until "
                                     "it is among the finished keys)")
        request = self.results.pop(key)
        tokens = request.out[:, -request.gen_length:].cpu()
        is_eos = torch.isin(tokens, torch.tensor(self.eos_ids))
        answer_lengths = torch.where(is_eos.any(-1), is_eos.int().argmax(-1), tokens.shape[1])
        text = None
        if request.tokenizer is not None:
            text = [request.tokenizer.decode(row[:n].tolist(), skip_special_tokens=True).strip()
                    for row, n in zip(tokens, answer_lengths.tolist())]
        return DecodeResult(tokens=tokens, nfe=request.nfe.cpu(), answer_lengths=answer_lengths,
                            seconds=request.seconds, text=text, trace=request.trace)

    def snapshot(self, key: Hashable) -> tuple[Tensor, Tensor]:
        """A request's generation region as it stands, on the CPU: (n, G) tokens ([MASK] where
        undecided) and (n,) the length of each row's final prefix, the answer tokens no later
        step can change (up to its first masked column). Servers stream that prefix."""
        request = self.results.get(key) or next(
            (r for r in [*self.requests, *(p[0] for p in self.pending)] if r.key == key), None)
        if request is None:
            raise self._missing(key, "")
        canvas = request.out.clone()
        if key not in self.results and self.rows is not None:
            mine = [i for i, r in enumerate(self.bounds.request) if self.requests[r] is request]
            if mine:
                index = torch.tensor(mine, device=self.device)
                self._store(canvas, self.rows.slot[index], self.rows.x[index],
                            self.bounds.gen_start[mine[0]], request.gen_length)
        tokens = canvas[:, -request.gen_length:].cpu()
        masked = tokens == self.mask_id
        final = torch.where(masked.any(-1), masked.int().argmax(-1), tokens.shape[1])
        return tokens, final

    def nfe_of(self, key: Hashable) -> int:
        """Forwards a request still decoding has taken part in with work to do (its most busy row)."""
        request = next((r for r in self.requests if r.key == key), None)
        if request is None:
            raise self._missing(key, "is not decoding (waiting to join, finished or cancelled)")
        return int(request.nfe.max())

    def _missing(self, key: Hashable, in_flight: str) -> UnknownRequest:
        """The error for a key this batch cannot answer for: unknown, or (`in_flight`) known but
        not in the state the call needs."""
        known = key in self.results or any(r.key == key for r in [*self.requests, *(p[0] for p in self.pending)])
        if known and in_flight:
            return UnknownRequest(f"request {key!r} {in_flight}")
        return UnknownRequest(f"no request {key!r} in this batch (results are handed over once)")

    def cancel(self, key: Hashable) -> None:
        """Drop a request (waiting or decoding): its rows leave at once and it has no result."""
        self.pending = [p for p in self.pending if p[0].key != key]
        for index, request in enumerate(self.requests):
            if request.key == key and request.live:
                request.cancelled = True
                self._drop([r == index for r in self.bounds.request], store=False)
        if not any(self.bounds.busy):       # no row left with work in this block: the phase is over
            self.block_step = 0

    # -- one step ------------------------------------------------------------------------------

    def step(self) -> list[Hashable]:
        """One denoising step of every row (one forward). Returns the keys of the requests that
        finished in it."""
        if self.block_step == 0:
            self._admit()
            if self.rows is None or not len(self.bounds):
                return self._collect()
            self.bounds.advance([self.requests[r].config.block_length for r in self.bounds.request],
                                grid=self.grid is not None)
            self.budgets = {g: self.bounds.budget(rows) for g, rows in self._members().items()}
        logits, offset = self._logits()
        base = self._base_view(logits, offset)
        commit, tokens, remask, edit, worked, edited, gen_end, broken = [], [], [], [], [], [], [], []
        truncated = False
        for g, rows in self._members().items():
            if not any(self.bounds.busy[r] for r in rows):
                # a request whose rows all finished their blocks waits for the phase to end; it
                # takes no step (no draws, no scheduler call), exactly as if it decoded alone
                idle = torch.zeros(len(rows), base["window"].shape[1], dtype=torch.bool, device=self.device)
                commit.append(idle), tokens.append(idle.long()), remask.append(idle), edit.append(idle)
                worked.append(idle[:, 0]), edited.append(idle[:, 0]), broken.append(idle[:, 0])
                gen_end.append(self._tensor(f"gen_end{g}", tuple(self.bounds.gen_end[r] for r in rows),
                                            [self.bounds.gen_end[r] for r in rows]))
                continue
            inp, decision, nonfinite = self._decide(g, rows, base)
            broken.append(nonfinite)
            c, t, rm, ed = self._resolve(g, inp, decision)
            commit.append(c), tokens.append(t), remask.append(rm), edit.append(ed)
            finish = decision.finish if decision.finish is not None else torch.zeros_like(inp.live)
            flags = [self.bounds.revising[r] for r in rows]
            revising = self._tensor(f"revising{g}", tuple(flags), flags).bool()
            worked.append(inp.live | finish | revising)
            edited.append(ed.any(-1))
            end = inp.gen_span[:, 1]
            truncated = truncated or decision.truncate_at is not None
            gen_end.append(end if decision.truncate_at is None else torch.minimum(end, decision.truncate_at))
            self._record(g, inp, c, t, rm, ed)
        order = self._order()
        commit, tokens, remask, edit, worked, edited, gen_end, broken = (
            _in_batch_order(parts, order)
            for parts in (commit, tokens, remask, edit, worked, edited, gen_end, broken))
        self._write(offset, commit, tokens, remask, edit, gen_end if truncated else None)
        self._bookkeep(worked, edited, gen_end, broken)
        return self._collect()

    # -- tensor work ---------------------------------------------------------------------------

    def _admit(self) -> None:
        """Between phases: finished requests leave the table, pending ones join (their rows
        appended, everyone right-aligned to one canvas) and the cache starts afresh."""
        if not self.pending:
            return
        self._compact()
        for request, canvas, mask, ids in self.pending:
            n = canvas.shape[0]
            index = len(self.requests)
            self.requests.append(request)
            request.state = request.config.scheduler.init_state(n, self.device)
            slot = torch.arange(n, device=self.device)
            revising = request.config.scheduler.revises != "none"
            if self.rows is None or not len(self.bounds):
                counts = torch.zeros_like(canvas, dtype=torch.int32) if revising else None
                self.rows, self.bounds = Rows(canvas, mask, slot, counts), Bounds()
            else:
                shift = max(0, canvas.shape[1] - self.rows.x.shape[1])
                self.bounds.shift(shift)
                revising = revising or self.rows.revisions is not None
                self.rows = self.rows.append(canvas, mask, slot, revising, self.eos_ids[0])
            width = self.rows.x.shape[1]
            gen_start = width - canvas.shape[1] + request.out.shape[1] - request.gen_length
            lengths = [len(row) for row in ids]
            self.bounds.extend(Bounds([index] * n, lengths, [gen_start] * n, [width] * n, [gen_start] * n,
                                      [gen_start] * n, [0] * n, [False] * n, [True] * n))
        self.pending.clear()
        self.columns = torch.arange(self.rows.x.shape[1], device=self.device)
        self.cache_state = self.cache.init_state(self.model)    # every block start refreshes anyway
        self._memo.clear()

    def _compact(self) -> None:
        """Drop finished requests from the table (their results stay in `results`)."""
        keep = [i for i, r in enumerate(self.requests) if r.live]
        if len(keep) == len(self.requests):
            return
        renumber = {old: new for new, old in enumerate(keep)}
        self.requests = [self.requests[i] for i in keep]
        self.bounds.request = [renumber[r] for r in self.bounds.request]
        self._memo.clear()

    def _members(self) -> dict[int, list[int]]:
        """Request index -> its rows' batch positions (host lists, rebuilt when rows change)."""
        key = tuple(self.bounds.request)
        cached = self._memo.get("members")
        if cached is None or cached[0] != key:
            members: dict[int, list[int]] = {}
            for i, r in enumerate(self.bounds.request):
                members.setdefault(r, []).append(i)
            self._memo["members"] = (key, members)     # type: ignore[assignment]
            cached = self._memo["members"]
        return cached[1]                                # type: ignore[return-value]

    def _order(self) -> Tensor | None:
        """Permutation from the requests' concatenated rows back to batch order (None: same)."""
        flat = [i for rows in self._members().values() for i in rows]
        if flat == sorted(flat):
            return None
        return self._tensor("order", tuple(flat), [flat.index(i) for i in range(len(flat))])

    def _tensor(self, name: str, key: tuple, value: Any) -> Tensor:
        """A device tensor of host values, rebuilt only when `key` changes (bounds change at block
        starts and row drops, not every step)."""
        cached = self._memo.get(name)
        if cached is None or cached[0] != key:
            cached = (key, torch.tensor(value, dtype=torch.long, device=self.device))
            self._memo[name] = cached
        return cached[1]

    def _scope(self, rows: list[int]) -> str:
        return self.requests[self.bounds.request[rows[0]]].config.scheduler.revises

    def _region_starts(self) -> list[int]:
        """First column each row may commit in: its block start, or its generation start under a
        scheduler that takes back earlier blocks."""
        b = self.bounds
        return [g if self.requests[r].config.scheduler.revises == "generated" else s
                for r, g, s in zip(b.request, b.gen_start, b.start)]

    def _region_start(self) -> Tensor:
        """(b, 1) `_region_starts` on the device."""
        starts = self._region_starts()
        return self._tensor("region", tuple(starts), starts).unsqueeze(-1)

    def _logits(self) -> tuple[Tensor, int]:
        """Logits for the active window: the phase's blocks, or everything after the earliest
        block start when a rule needs the rest (`view = "rest"`) and the cache computed it."""
        lo, hi = min(self._region_starts()), max(self.bounds.end)
        if self.grid is not None:           # whole model blocks: the rows a block-causal cache needs
            b = self.bounds
            spans = [b.grid_span(i, s, e, self.grid) for i, (s, e) in enumerate(zip(self._region_starts(), b.end))]
            lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
        logits, offset, self.cache_state = self.cache.logits(
            self.model, self.rows.x, self.rows.attention_mask, (lo, hi), self.block_step, self.cache_state)
        wide = any(r.config.scheduler.view == "rest" or any(f.view == "rest" for f in r.config.filters)
                   for r in self.requests if r.live)
        if not wide and offset + logits.shape[1] > hi:
            logits = logits[:, :hi - offset]
        return logits, offset

    def _base_view(self, logits: Tensor, offset: int) -> dict[str, Any]:
        """What every request's view shares: the window's tokens, masks, bounds."""
        b = self.bounds
        width = logits.shape[1]
        block = self._tensor("block", (tuple(b.start), tuple(b.end)), list(zip(b.start, b.end)))
        gen_span = self._tensor("gen_span", (tuple(b.gen_start), tuple(b.gen_end)),
                                list(zip(b.gen_start, b.gen_end)))
        window = self.rows.x[:, offset:offset + width]
        is_masked = window == self.mask_id
        columns = self.columns[offset:offset + width]
        in_region = (columns >= self._region_start()) & (columns < block[:, 1:])
        if self.block_step == 0:     # a token-shifted block model commits the block start alone
            alone = block_start_columns(self.model, is_masked, columns, block[:, :1],
                                        [b.position(i, s) for i, s in enumerate(b.start)])
            in_region = in_region if alone is None else in_region & alone
        revisable = None
        if self.rows.revisions is not None:
            revisions = self.rows.revisions[:, offset:offset + width]
            revisable = ~is_masked & in_region & (columns >= gen_span[:, :1]) & (revisions < MAX_REVISIONS)
        return {"logits": logits, "offset": offset, "block": block, "gen_span": gen_span,
                "window": window, "is_masked": is_masked, "in_region": in_region,
                "revisable": revisable, "columns": columns,
                "region_start": self._region_start().squeeze(-1)}

    def _decide(self, g: int, rows: list[int], base: dict[str, Any]) -> tuple[StepInput, Decision, Tensor]:
        """Request `g`'s view of the step, its scheduler's and filters' decision, and (b_g,) rows
        whose model logits were not finite (read by the step's one host sync)."""
        request = self.requests[g]
        scheduler = request.config.scheduler
        pick = _rows_of(base, rows, self._tensor(f"rows{g}", tuple(rows), rows))
        starts = self._region_starts()
        span = max(self.bounds.gen_end[r] - starts[r] for r in rows)
        region = (pick["region_start"], span, base["offset"])
        eligible = pick["is_masked"] & pick["in_region"]
        revisable = torch.zeros_like(eligible)
        if scheduler.revises != "none" and pick["revisable"] is not None:
            revisable = pick["revisable"]
        inp = self._view(request, region, pick["logits"], StepInput(
            step=self.block_step, num_steps=self.budgets[g], offset=base["offset"],
            block=pick["block"], gen_span=pick["gen_span"], is_masked=pick["is_masked"],
            eligible=eligible, candidates=pick["window"], confidence=eligible.float(),
            probs=pick["logits"], logits=pick["logits"], live=eligible.any(-1),
            current=pick["window"].clone(), revisable=revisable, generator=request.generator,
            eos_ids=self.eos_ids, mask_id=self.mask_id))
        nonfinite = inp.probs.gather(-1, inp.candidates.unsqueeze(-1)).squeeze(-1).isnan().any(-1)
        processed, request.state = scheduler.process_logits(inp, request.state)
        if processed is not None:
            inp = self._view(request, region, processed, inp)
        if self.block_step == 0:
            ends, request.state = scheduler.block_end(inp, request.state)
            if ends is not None:
                inp = self._rebound(g, rows, inp, ends)
        decision, request.state = scheduler.select(inp, request.state)
        for f in request.config.filters:
            decision = f(inp, decision)
        return inp, decision, nonfinite

    def _view(self, request: Request, region: tuple[Tensor, int, int], logits: Tensor,
              inp: StepInput) -> StepInput:
        """Candidates and confidences from (processed) logits; [MASK] is never a candidate.
        Sampling noise is drawn for each row's own region (from its active block to its
        generation end), never for the batch's window, so it does not depend on the batch."""
        logits = logits.float().index_fill(-1, self._mask_column(), torch.finfo(torch.float32).min)
        probs = logits.softmax(-1)
        candidates = gumbel_argmax(logits, request.config.temperature, request.generator, region)
        confidence = probs.gather(-1, candidates.unsqueeze(-1)).squeeze(-1)
        return dataclasses.replace(inp, logits=logits, probs=probs, candidates=candidates,
                                   confidence=masked_scores(confidence, inp.eligible))

    def _mask_column(self) -> Tensor:
        return self._tensor("mask_column", (self.mask_id,), [self.mask_id])

    def _rebound(self, g: int, rows: list[int], inp: StepInput, ends: Tensor) -> StepInput:
        """The view with the block ends the scheduler just chose (once per block start)."""
        b = self.bounds
        for r, e in zip(rows, ends.tolist()):
            b.end[r] = max(b.start[r] + 1, min(int(e), b.gen_end[r]))
        self.budgets[g] = b.budget(rows)
        block = self._tensor(f"block{g}", tuple((b.start[r], b.end[r]) for r in rows),
                             [(b.start[r], b.end[r]) for r in rows])
        starts = [b.gen_start[r] if self._scope(rows) == "generated" else b.start[r] for r in rows]
        region = self._tensor(f"region{g}", tuple(starts), starts).unsqueeze(-1)
        in_region = (inp.columns >= region) & (inp.columns < block[:, 1:])
        eligible = inp.is_masked & in_region
        confidence = masked_scores(inp.probs.gather(-1, inp.candidates.unsqueeze(-1)).squeeze(-1), eligible)
        return dataclasses.replace(inp, block=block, eligible=eligible, confidence=confidence,
                                   live=eligible.any(-1), num_steps=self.budgets[g],
                                   revisable=inp.revisable & in_region)

    def _resolve(self, g: int, inp: StepInput, decision: Decision) -> tuple[Tensor, ...]:
        """The commits, tokens, re-masks and edits the loop accepts for request `g`'s rows."""
        commit, tokens = decision.resolve(inp)
        none = torch.zeros_like(commit)
        if self.requests[g].config.scheduler.revises == "none":
            return commit, tokens, none, none
        remask = none if decision.remask is None else decision.remask & inp.revisable
        edit = none if decision.edit is None else (
            decision.edit & inp.revisable & ~remask & (tokens != inp.current) & (tokens != inp.mask_id))
        # at most (commits - 1) re-masks per row, the least supported token first: a block ends
        support = inp.probs.gather(-1, inp.current.unsqueeze(-1)).squeeze(-1)
        allowed = (commit.sum(-1) - 1).clamp_min(0)
        return commit, tokens, topk_mask(masked_scores(-support, remask), allowed), edit

    def _record(self, g: int, inp: StepInput, commit: Tensor, tokens: Tensor, remask: Tensor,
                edit: Tensor) -> None:
        request = self.requests[g]
        if request.trace is None:
            return
        rows = self._members()[g]
        slots = self.rows.slot[self._tensor(f"rows{g}", tuple(rows), rows)]
        gen_start = self.bounds.gen_start[rows[0]]         # a request's rows share it
        entry = {"rows": slots.cpu(), "offset": inp.offset - gen_start, "commit": commit.cpu(),
                 "tokens": tokens.cpu(), "confidence": inp.confidence.cpu(), "block_step": inp.step}
        if request.config.scheduler.revises != "none":
            entry.update(remask=remask.cpu(), edit=edit.cpu())
        report = self.cache.report(self.cache_state)
        if report is not None:             # per-step cache counts (refreshed layers, recomputed columns)
            index = self._tensor(f"rows{g}", tuple(rows), rows)
            entry["cache"] = {key: value.index_select(0, index).cpu() for key, value in report.items()}
        request.trace.append(entry)

    def _write(self, offset: int, commit: Tensor, tokens: Tensor, remask: Tensor, edit: Tensor,
               truncate_at: Tensor | None) -> None:
        rows = self.rows
        columns = slice(offset, offset + commit.shape[1])
        current = rows.x[:, columns]
        written = torch.where(commit | edit, tokens, current).masked_fill(remask, self.mask_id)
        if rows.revisions is not None:
            rows.revisions[:, columns] += (remask | edit).int()
        rows.x[:, columns] = written
        if truncate_at is not None:
            self._truncate(truncate_at)

    def _truncate(self, gen_end: Tensor) -> None:
        """Columns at or after a row's (new) generation end become end-of-text and are never
        attended again."""
        gen_end = gen_end.clamp_min(self._tensor("gen_start", tuple(self.bounds.gen_start),
                                                 self.bounds.gen_start))
        cut = self.columns >= gen_end.unsqueeze(-1)
        rows = self.rows
        rows.x = torch.where(cut, self.eos_ids[0], rows.x)
        mask = torch.ones_like(rows.x) if rows.attention_mask is None else rows.attention_mask
        rows.attention_mask = mask.masked_fill(cut, 0)

    # -- host bookkeeping ----------------------------------------------------------------------

    def _bookkeep(self, worked: Tensor, edited: Tensor, gen_end: Tensor, broken: Tensor) -> None:
        """The step's single host sync: count forwards, stop rows at end-of-text, drop finished
        rows, and end the phase when no row has a mask left in its block (or an edit pass to run)."""
        rows, b = self.rows, self.bounds
        block = self._tensor("block", (tuple(b.start), tuple(b.end)), list(zip(b.start, b.end)))
        in_block = (self.columns >= self._region_start()) & (self.columns < block[:, 1:])
        gen_start = self._tensor("gen_start", tuple(b.gen_start), b.gen_start).unsqueeze(-1)
        still = rows.x == self.mask_id
        for g, members in self._members().items():
            request = self.requests[g]
            index = self._tensor(f"rows{g}", tuple(members), members)
            request.nfe.index_add_(0, rows.slot[index], worked[index].long())
        block_left, gen_left, block_eos, edits, gen_end_list, nonfinite = torch.stack([
            (still & in_block).any(-1).long(), (still & (self.columns >= gen_start)).any(-1).long(),
            (torch.isin(rows.x, self.eos) & in_block).any(-1).long(), edited.long(), gen_end,
            broken.long(),
        ]).tolist()                                      # the one host sync of the step
        if any(nonfinite):
            name = getattr(self.model, "name_or_path", None) or type(self.model).__name__
            raise NonFiniteLogits(f"model {name} produced NaN or infinite logits (rows "
                                  f"{[i for i, bad in enumerate(nonfinite) if bad]} of the batch): "
                                  f"check its weights and dtype (float16 overflows), not the scheduler")
        b.gen_end = gen_end_list
        b.end = [min(e, g) for e, g in zip(b.end, gen_end_list)]
        self._post_fill(block_left, edits)
        configs = [self.requests[r].config for r in b.request]
        stops = [bool(c.stop_at_eos and not left and eos and not rev)
                 for c, left, eos, rev in zip(configs, block_left, block_eos, b.revising)]
        if any(stops):                     # the rest of a stopped row is end-of-text
            after = self.columns >= torch.tensor(b.end, device=self.device).unsqueeze(-1)
            stopped = torch.tensor(stops, device=self.device).unsqueeze(-1)
            rows.x = torch.where(after & stopped, self.eos_ids[0], rows.x)
        b.busy = [bool(left or rev) for left, rev in zip(block_left, b.revising)]
        done = [(not left and not rev) or stop for left, rev, stop in zip(gen_left, b.revising, stops)]
        phase_over = not any(left or rev for left, rev, d in zip(block_left, b.revising, done) if not d)
        cap = max(self.budgets[r] + self.requests[r].config.scheduler.post_steps + 1 for r in set(b.request))
        if any(done):
            self._drop(done)
        if self.trimmable and len(self.bounds):
            self._trim(max(self.bounds.gen_end))
        self.block_step = 0 if phase_over else self.block_step + 1
        if self.block_step > cap:
            raise RuntimeError("a block still has masks after one step per position: a scheduler "
                               "or filter broke the progress rule")

    def _post_fill(self, block_left: list[int], edits: list[int]) -> None:
        """Edit passes after a row's block is full (token editing): one follows the step that
        filled the block and each pass that edited, up to the scheduler's `post_steps`."""
        b = self.bounds
        for i, (left, edited) in enumerate(zip(block_left, edits)):
            budget = self.requests[b.request[i]].config.scheduler.post_steps
            if not budget:
                continue
            ran_post = b.revising[i]
            b.post[i] += ran_post
            b.revising[i] = bool(not left and b.post[i] < budget and (edited or not ran_post))

    def _trim(self, width: int) -> None:
        """Cut the canvas columns no live row attends any more (every row truncated before them),
        so the cost of a forward follows the live canvas. Exact: those columns were already
        masked out of attention."""
        if width >= self.rows.x.shape[1]:
            return
        self.rows = self.rows.trim(width)
        self.columns = self.columns[:width]
        self.cache_state = self.cache.trim(self.cache_state, width)
        self._memo.clear()

    def _store(self, canvas: Tensor, slots: Tensor, x: Tensor, gen_start: int, gen_length: int) -> None:
        """Write rows' generation regions (rows of one request share `gen_start`) into their
        request's canvas slots; a trimmed tail is end-of-text. No host sync."""
        region = x[:, gen_start:gen_start + gen_length]
        first = canvas.shape[1] - gen_length
        canvas[slots, first:] = self.eos_ids[0]
        canvas[slots, first:first + region.shape[1]] = region

    def _drop(self, done: list[bool], store: bool = True) -> None:
        """Finished rows leave the batch; their canvases go to their requests' `out`."""
        b = self.bounds
        for g, members in self._members().items():
            gone = [i for i in members if done[i]]
            if not gone:
                continue
            request = self.requests[g]
            request.live -= len(gone)
            if store:
                index = self._tensor(f"gone{g}", tuple(gone), gone)
                self._store(request.out, self.rows.slot[index], self.rows.x[index],
                            b.gen_start[gone[0]], request.gen_length)
        kept_list = [i for i, d in enumerate(done) if not d]
        kept = torch.tensor(kept_list, dtype=torch.long, device=self.device)
        for g, members in self._members().items():
            request = self.requests[g]
            local = [j for j, i in enumerate(members) if not done[i]]
            if len(local) < len(members):
                request.state = request.config.scheduler.select_rows(
                    request.state, torch.tensor(local, dtype=torch.long, device=self.device))
        self.rows = self.rows.keep(kept)
        self.bounds = b.keep(kept_list)
        self.cache_state = self.cache.select_rows(self.cache_state, kept)
        self._memo.clear()

    def _collect(self) -> list[Hashable]:
        """Requests whose last row left: their results become available; returns their keys."""
        finished = []
        for request in self.requests:
            if request.live == 0 and not request.cancelled and request.key not in self.results:
                request.seconds = time.perf_counter() - request.started
                self.results[request.key] = request
                finished.append(request.key)
        return finished


def _rows_of(base: dict[str, Any], rows: list[int], index: Tensor) -> dict[str, Any]:
    """The batch-first tensors of `base` restricted to `rows` (`index` on the device); `base`
    itself when they are every row in order."""
    if rows == list(range(base["window"].shape[0])):
        return base
    return {k: v.index_select(0, index) if isinstance(v, Tensor) and k != "columns" else v
            for k, v in base.items()}


def _in_batch_order(parts: list[Tensor], order: Tensor | None) -> Tensor:
    joined = parts[0] if len(parts) == 1 else torch.cat(parts)
    return joined if order is None else joined.index_select(0, order)


def _device_of(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device(getattr(model, "device", "cpu"))
