"""`generate`: the one denoising loop. Schedulers, caches and filters plug into it.

`Decoding` holds a running batch and advances it one denoising step at a time; `generate` adds
one request and steps it to the end, and a server adds requests as they come (they join between
blocks and leave when they finish). Per step: the canvas kind (`.canvas`: [MASK] or noise in an
open column) gives logits for the active window through the cache, each request's rows get their
view (`StepInput`), its scheduler and then its filters decide, `Decision.resolve` applies the
loop's rules, the commits are written, and one host sync updates the bookkeeping. The invariants
hold for every scheduler, once, here: commits lie in the open part of the row's active block (an
"all-in" finish may fill every open column it sees), every row with work commits at least one
token per step (a noise canvas commits whole canvases, within its step budget), [MASK] is never
written, committed tokens change only under a scheduler that declares `revises` (then only inside
its scope, and every step still leaves one mask fewer), every block ends with no open column,
and a hard step cap turns a stuck block into an error instead of masked output.

`Decoding` orchestrates: the step's maths live in `dllm_decode.step`, the batch geometry in
`.running`, the request side in `.member`, each request's host turn in `.turns` (`.noise_turn`
on a noise canvas); `.reference` is the loop for one request in locals. Features plug in through
the step's records (`.records`) and the executors, never as copies of the loop."""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from dllm_decode.adapters import adapter_index, adapter_rows
from dllm_decode.capture import executor_for, phase_problem
from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.devices import device_of
from dllm_decode.errors import NonFiniteLogits, UnknownRequest
from dllm_decode.interfaces import Cache, DiffusionLM
from dllm_decode.prompts import left_pad
from dllm_decode.provisional import Proposal
from dllm_decode.models.block_grid import grid_canvas
from dllm_decode.canvas import canvas_of
from dllm_decode.member import Member, OneThread, check_decoding, check_request
from dllm_decode.running import Batch
from dllm_decode.records import Outcome
from dllm_decode.step import MAX_REVISIONS, Window
from dllm_decode.turns import draw

__all__ = ["MAX_REVISIONS", "Decoding", "UnknownRequest", "generate"]


@torch.inference_mode()
def generate(model: DiffusionLM, prompts: Sequence[str] | Sequence[Sequence[int]],
             config: DecodeConfig, *, generator: torch.Generator | None = None,
             tokenizer: Any = None, trace: bool = False, capture: Any = "off") -> DecodeResult:
    """Decode a batch of prompts in semi-autoregressive blocks (a uniform-noise model: canvases).

    Args:
        model: a DiffusionLM (see `dllm_decode.interfaces`).
        prompts: B strings (encoded with `tokenizer`, default `model.tokenizer`) or B token-id lists.
        config: scheduler, cache, filters, lengths, temperature, EOS policy, seed.
        generator: the only source of randomness (temperature > 0, random scores); default a
            generator seeded with `config.seed`.
        tokenizer: for string prompts and decoded text.
        trace: record which positions were committed at which step with which confidence.
        capture: how each step's model forward runs: "off" (eager, the default), a mode of
            `dllm_decode.capture.CAPTURE_MODES` ("static", "compile", "cuda-graphs",
            "regional") or a `GraphCache`. A configuration it cannot serve runs eagerly, with
            a `CaptureFallback` warning (`dllm_decode.capture.capture_problem` says why).
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
    decoding = Decoding(model, config.cache, trace=trace, capture=capture)
    key = decoding.add(prompts, config, generator=generator, tokenizer=tokenizer)
    while not decoding.finished:
        decoding.step()
    return decoding.result(key)


class Decoding:
    """A running batch: requests (each its own config, generator and lengths) decoded together
    with one cache, advanced by `step()`.

    All rows decode their current block in lockstep (a phase); a row whose block is done waits,
    with no eligible column, for the others. Requests added with `add` join at the next phase
    boundary. Rows leave when their generation region has no mask left or when they stop at an
    end-of-text token; a request is done when its last row leaves (`step` returns its key and
    `result(key)` its `DecodeResult`). A request's output does not depend on what else is in the
    batch (greedy; and with sampling too, since each draws from its own generator).

    One thread owns a `Decoding`: a call made while another thread is inside `step`, `add`,
    `cancel`, `result` or `snapshot` raises `RuntimeError` (calls are not serialised; a server
    gives the object to one worker thread).
    """

    def __init__(self, model: DiffusionLM, cache: Cache, *, trace: bool = False, capture: Any = "off"):
        check_decoding(model, cache, trace)
        self.model, self.cache, self.trace = model, cache, trace
        cache.init_state(model)              # a cache that cannot serve this model says so now
        self.canvas = canvas_of(model, trace, capture)   # what an open column holds ([MASK], noise)
        # what runs the cache's plans: the cache (eager) or the captured step (`capture.dispatch`)
        self.runner, self.capture_problem = executor_for(model, cache, self.canvas.cache_capture(capture))
        self.fused: str | None = "eager"     # why this phase decides on the host (None: in the graph)
        self.device = device_of(model)
        self.mask_id = self.canvas.open_id
        self.eos_ids = tuple(model.eos_token_ids)
        self.eos = torch.tensor(self.eos_ids, dtype=torch.long, device=self.device)
        self.trimmable = bool(getattr(model, "trimmable", False))
        self.grid: int | None = getattr(model, "block_size", None)     # block-causal models
        self.batch = Batch(self.device, self.mask_id, self.canvas.pad_id)
        self.pending: list[tuple[Member, Tensor, Tensor | None, list[list[int]]]] = []
        self.results: dict[Hashable, Member] = {}
        self.cache_state: Any = None
        self.block_step = 0
        self.budgets: dict[int, int] = {}
        self._keys = itertools.count()       # automatic keys: never reused by this object
        # a key put here (by a server streaming provisional text) gets its last step's proposals
        self.proposals: dict[Hashable, Proposal | None] = {}
        # the cross-request prefix cache's hook (`prefix_reuse.PrefixReuse`; eager steps only)
        self.reuse: Any = None
        self._owner = OneThread("this Decoding")  # step/add/cancel/result/snapshot: one thread

    # -- requests ------------------------------------------------------------------------------

    def add(self, prompts: Sequence[str] | Sequence[Sequence[int]], config: DecodeConfig, *,
            generator: torch.Generator | None = None, tokenizer: Any = None,
            key: Hashable | None = None, adapter: str | None = None) -> Hashable:
        """Queue a request; it joins the batch at the next phase boundary. Returns its key (by
        default a number this object never hands out twice).

        `adapter`: the name of a LoRA adapter attached to the model (`adapters.attach`) its rows
        decode with (None: the model's own weights).

        Raises:
            ValueError: empty prompt, prompt plus generation longer than the model's context, a
                cache other than this batch's, a key already in use, an adapter not attached.
        """
        ids, tokenizer = check_request(self.model, self.cache, prompts, config, generator, tokenizer)
        adapter_id = adapter_index(self.model, adapter)
        with self._owner:
            if key is None:
                key = next(k for k in self._keys if not self._known(k))
            elif self._known(key):
                raise ValueError(f"request key {key!r} is already in use")
            canvas, mask = left_pad(ids, config.gen_length, self.mask_id, self.canvas.pad_id, self.device)
            generator = generator if generator is not None else \
                torch.Generator(device=self.device).manual_seed(config.seed)
            member = Member(key, config, generator, tokenizer, out=canvas.clone(), live=len(ids),
                            nfe=torch.zeros(len(ids), dtype=torch.long, device=self.device),
                            trace=[] if self.trace else None, adapter=adapter_id)
            self.canvas.join(self.model, member, len(ids), self.device)
            canvas, mask = grid_canvas(self.model, canvas, mask, [len(row) for row in ids],  # whole
                                       config.gen_length, self.mask_id, self.canvas.pad_id)   # blocks
            self.pending.append((member, canvas, mask, ids))
        return key

    @property
    def finished(self) -> bool:
        """No row decoding and none waiting to join."""
        return not self.pending and not len(self.batch)

    @property
    def accepts_joins(self) -> bool:
        """A request added now joins at the next phase boundary; False while rows decode under a
        cache with batch-wide state (`Cache.mid_run_joins`): it waits until every row is done."""
        return not len(self.batch) or getattr(self.runner, "mid_run_joins", True)

    def result(self, key: Hashable) -> DecodeResult:
        """The finished request's result (tokens, text, NFE, seconds, trace), handed over once.

        Raises:
            KeyError: no finished request has that key (still decoding, cancelled, or taken).
        """
        with self._owner:
            if key not in self.results:
                raise self._missing(key, "has no result yet: it is still decoding (call step() "
                                         "until it is among the finished keys)")
            member = self.results.pop(key)
        return member.result(self.eos_ids)

    def snapshot(self, key: Hashable) -> tuple[Tensor, Tensor]:
        """A request's generation region as it stands, on the CPU: (n, G) tokens (the canvas
        kind's `open_id`, [MASK] or -1, where undecided) and (n,) the length of each row's final
        prefix, the answer tokens no later step can change (up to its first open column).
        Servers stream that prefix."""
        with self._owner:
            member = self.results.get(key) or self._find(key)
            if member is None:
                raise self._missing(key, "")
            return self.batch.snapshot(member, decoding=key not in self.results)

    def nfe_of(self, key: Hashable) -> int:
        """Forwards a request still decoding has taken part in with work to do (its most busy row)."""
        member = next((m for m in self.batch.members if m.key == key and not m.cancelled), None)
        if member is None:
            raise self._missing(key, "is not decoding (waiting to join, finished or cancelled)")
        return int(member.nfe.max())

    def cancel(self, key: Hashable) -> None:
        """Drop a request (waiting or decoding): its rows leave at once and it has no result."""
        with self._owner:
            self.pending = [p for p in self.pending if p[0].key != key]
            for g, member in enumerate(self.batch.members):
                if member.key == key and member.live:
                    member.cancelled = True
                    self._drop([r == g for r in self.batch.bounds.request], store=False)
            if not any(self.batch.bounds.busy):    # no row left with work in this block: phase over
                self.block_step = 0

    # -- one step ------------------------------------------------------------------------------

    def step(self) -> list[Hashable]:
        """One denoising step of every row (one forward). Returns the keys of the requests that
        finished in it."""
        with self._owner:
            batch = self.batch
            reuse = None
            if self.block_step == 0:
                if self.pending and self.accepts_joins:   # between phases; the cache starts afresh
                    batch.admit(self.pending)
                    self.pending = []
                    self.cache_state = self.runner.admit(self.cache_state, self.model)
                    reuse = self.reuse if self.runner is self.cache else None
                if not len(batch):
                    return self._collect()
                self.budgets = batch.start_phase(grid=self.grid is not None)
                if reuse is not None:      # stored K/V of earlier requests' prefixes
                    self.cache_state = reuse.restore(batch, self.cache_state)
                self.fused = self.capture_problem or ("eager" if self.runner is self.cache else
                                                      phase_problem(batch, self.budgets, self.model, self.trace))
            lo, hi = batch.span(self.grid)       # the window: every row's region to its block end
            if self.fused is None:               # the whole step in one graph, drawn as `turn` draws
                outcome, offset, self.cache_state = self.runner.step(
                    self.model, batch, (lo, hi), self.block_step, self.cache_state, self.budgets,
                    self.mask_id, self.eos_ids, draw)
            else:
                with adapter_rows(self.model, batch):          # unmerged LoRA rows
                    logits, offset, self.cache_state = self.canvas.logits(
                        self.runner, self.model, batch, (lo, hi), self.block_step, self.cache_state)
                if reuse is not None:
                    reuse.remember(self.cache_state)
                window = batch.window(logits, offset, hi, self.model if self.block_step == 0 else None,
                                      self.cache.fresh(self.cache_state))
                # a request whose rows' blocks are all done waits for the phase to end: no draws, no call
                outcome = Outcome.join([
                    self._turn(g, window) if any(batch.bounds.busy[r] for r in rows)
                    else Outcome.idle(window.rows(batch.phase.index[g])) for g, rows in batch.groups.items()])
            batch.write(offset, outcome.resolved, outcome.gen_end if outcome.truncates else None)
            self._bookkeep(outcome)
            return self._collect()

    def _turn(self, g: int, window: Window) -> Outcome:
        """Request `g`'s step on the host (its canvas kind's turn)."""
        return self.canvas.turn(self.batch, g, window, model=self.model, block_step=self.block_step,
                    budgets=self.budgets, eos_ids=self.eos_ids, mask_id=self.mask_id,
                    report=lambda: self.runner.report(self.cache_state), proposals=self.proposals)

    # -- host bookkeeping ----------------------------------------------------------------------

    def _bookkeep(self, outcome: Outcome) -> None:
        """The step's single host sync: count forwards, stop rows at end-of-text, drop finished
        rows, and end the phase when no row has a mask left in its block (or an edit pass to run)."""
        batch = self.batch
        batch.count(outcome.worked)
        progress = batch.progress(outcome, self.eos)        # the one host sync of the step
        if any(progress.nonfinite):
            raise NonFiniteLogits.of(self.model, [i for i, bad in enumerate(progress.nonfinite) if bad])
        settled = batch.settle(progress, self.budgets)
        done = settled.done
        if any(done):
            self._drop(done)
        if self.trimmable and len(batch) and batch.trim(max(batch.bounds.gen_end)):
            self.cache_state = self.runner.trim(self.cache_state, batch.rows.x.shape[1])
        if batch.phase is not None:
            batch.phase.update(batch.bounds, batch.region_starts())
        self.block_step = 0 if settled.phase_over else self.block_step + 1
        if self.block_step > settled.cap:
            raise RuntimeError("a block still has masks after one step per position: a scheduler "
                               "or filter broke the progress rule")

    def _drop(self, done: list[bool], store: bool = True) -> None:
        """Finished rows leave the batch (and the cache); their canvases go to their requests."""
        kept = self.batch.drop(done, store)
        self.cache_state = self.runner.select_rows(self.cache_state, kept)

    def _collect(self) -> list[Hashable]:
        """Requests whose last row left: their results become available; returns their keys."""
        finished = []
        for member in self.batch.members:
            if member.live == 0 and not member.cancelled and member.key not in self.results:
                member.seconds = time.perf_counter() - member.started
                self.results[member.key] = member
                finished.append(member.key)
        return finished

    # -- keys ----------------------------------------------------------------------------------

    def _find(self, key: Hashable) -> Member | None:
        """The request waiting or decoding under `key`."""
        return next((m for m in [*self.batch.members, *(p[0] for p in self.pending)]
                     if m.key == key and not m.cancelled), None)

    def _known(self, key: Hashable) -> bool:           # finished, decoding or waiting
        return key in self.results or self._find(key) is not None

    def _missing(self, key: Hashable, in_flight: str) -> UnknownRequest:
        """The error for a key this batch cannot answer for: unknown, or (`in_flight`) known but
        not in the state the call needs."""
        return UnknownRequest.of(key, self._known(key) and in_flight)

