"""`Engine`: many requests served by the one loop, one denoising step at a time.

Requests wait in a FIFO queue and are admitted while the engine has free rows (`max_batch_size`).
Diffusion requests join a running batch of their cache configuration (`dllm_decode.sampler.Decoding`:
a request joins between blocks with its own decode record, generator and lengths, and leaves
when done); under a cache that takes no newcomer mid-run (`Cache.mid_run_joins`) a request that
arrives while its batch decodes starts another running batch (at most `HELD_BATCHES`).
`step()` advances every running batch by one denoising step and reports per request the answer
text that became final (for streaming) and, as soon as a request's answer can no longer change,
its final result: first done, first out (SGLang's `--dllm-fdfo`); its row leaves the batch at once.

A request's answer is final when its row has no mask left, when an end-of-text token lies in its
final prefix (everything before the first masked column: no later step can change it), or when
that prefix holds `max_tokens` answer tokens. Answers equal `generate` on the request alone,
greedy or sampled: a batch's rows do not interact (padding is masked, random draws are per row).

One thread owns the engine (the server's worker): `add`, `cancel` and `step` called while
another thread is inside one of them raise `RuntimeError` (refused, not serialised); `check`
reads no engine state and may be called from anywhere. What decodes is a
`Backend` (`dllm_decode.serving`): `DiffusionBackend` here for a DiffusionLM, `CausalBackend`
(`dllm_decode.causal_serving`) for a causal LM wrapped in `SpeculativeModel`.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from dllm_decode.cost import MAX_ROWS
from dllm_decode.adapters import adapter_index
from dllm_decode.capture import GraphCache, graph_cache
from dllm_decode.canvas import canvas_of
from dllm_decode.causal_serving import CausalBackend, SpeculativeModel
from dllm_decode.member import OneThread, check_context, owned
from dllm_decode.models.checkpoint import first_line
from dllm_decode.noise import check_canvas
from dllm_decode.prefix_options import PrefixOptions
from dllm_decode.prefix_reuse import PrefixSharing
from dllm_decode.provisional import Draft, canvas, draft
from dllm_decode.sampler import Decoding
from dllm_decode.serving import FINISH_REASONS, Backend, Event, Live, Output, Request, Update, vocab_size_of

__all__ = ["FINISH_REASONS", "Engine", "Output", "Request", "SpeculativeModel", "Update", "check_cache"]

log = logging.getLogger(__name__)


class Engine:
    """Continuous batching over the one denoising loop (see the module docstring).

    Args:
        model: a DiffusionLM, or a `SpeculativeModel` for a causal LM.
        tokenizer: decodes answers (default `model.tokenizer`; None: token ids only).
        max_batch_size: rows decoded at once across all groups; waiting requests are admitted
            in arrival order as rows free up.
        capture: how each running batch's model forward runs (`Decoding`'s `capture`: one of
            `dllm_decode.capture.CAPTURE_MODES`, or a `GraphCache` to start from). Each batch
            running at once holds a `GraphCache` of its own (its K/V lives in the cache's
            buffers); a finished batch hands its cache to the next one, so graphs are compiled
            or recorded once per bucket, not once per batch.
        prefix_cache_bytes: the byte budget of the cross-request prefix cache
            (`dllm_decode.prefix_reuse`: requests under an exact-reuse cache, the `block` cache of
            a block-causal model, start after the K/V of their longest stored prefix; a causal
            encoder's prompt, DiffusionGemma's, is encoded after it: `encoder_reuse`); 0: off.
        prefix_cache_approximate: > 0 opts in to approximate reuse of prompt K/V in chunks of
            this many tokens under caches that declare it (`prefix` on LLaDA/Dream); 0: off.
    Raises:
        ValueError: `max_batch_size` < 1; an unknown capture mode, `cuda-graphs` without CUDA,
            or a capture mode for a causal LM; a prefix cache with a capture mode or a causal LM.
    """

    def __init__(self, model: Any, tokenizer: Any = None, max_batch_size: int = 8,
                 capture: Any = "off", prefix_cache_bytes: int = 0, prefix_cache_approximate: int = 0):
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or not 1 <= max_batch_size <= MAX_ROWS:
            raise ValueError(f"max_batch_size must be an integer in [1, {MAX_ROWS}], got {max_batch_size!r}")
        prefix = PrefixOptions(prefix_cache_bytes, capture, isinstance(model, SpeculativeModel),
                               prefix_cache_approximate, bool(getattr(model, "supports_kv", True)
                                                              or getattr(model, "encoder_reuse", False)))
        graphs = graph_cache(capture)
        self.capture = "off" if graphs is None else graphs.mode
        """The step runtime: "off" (the eager forward) or the capture mode of every batch."""
        if graphs is not None and isinstance(model, SpeculativeModel):
            raise ValueError(f"capture {self.capture!r} runs a diffusion model's step; a causal "
                             f"LM decodes eagerly (use capture 'off')")
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        self.max_batch_size = max_batch_size
        self.prefix = prefix.sharing()
        """The cross-request prefix cache (None: off)."""
        self.backend: Backend = CausalBackend(model, self.tokenizer) if isinstance(model, SpeculativeModel) \
            else DiffusionBackend(model, self.tokenizer, graphs, self.prefix)
        self.eos_ids = self.backend.eos_ids
        self.waiting: collections.deque[Live] = collections.deque()
        self.lives: dict[str, Live] = {}
        self.pending: list[Update] = []          # cancellations, reported by the next step
        self.steps = 0
        self._owner = OneThread("this Engine")

    # -- the API -------------------------------------------------------------------------------

    def check(self, request: Request) -> None:
        """Raise the one-line `ValueError` `add` would raise for this request's content (the
        id aside). Reads no engine state, so another thread may call it.

        Raises:
            ValueError: prompt plus generation longer than the model's context; a token id
                outside the vocabulary; a cache the model cannot use, or scheduler ids it does
                not have (`Scheduler.check_fits`); a decode record this model cannot run.
        """
        check_context(self.model, len(request.prompt), request.config.gen_length)
        vocab = self.backend.vocab_size
        if vocab is not None and (bad := next((t for t in request.prompt if not 0 <= t < vocab), None)) is not None:
            raise ValueError(f"the prompt holds token id {bad}, outside the vocabulary [0, {vocab})")
        if request.provisional and not self.backend.drafts:
            raise ValueError("provisional streaming needs a diffusion model (a causal LM's text is "
                             "final as it is written): use the committed stream mode")
        self.backend.check(request)

    @owned
    def add(self, request: Request) -> None:
        """Queue a request.

        Raises:
            ValueError: an id already in flight, or what `check` raises.
        """
        if not isinstance(request, Request):
            raise TypeError(f"Engine.add takes a Request, got {type(request).__name__}")
        if request.id in self.lives:
            raise ValueError(f"request id {request.id!r} is already in flight")
        self.check(request)
        live = Live(request, added=time.perf_counter())
        self.lives[request.id] = live
        self.waiting.append(live)

    @owned
    def cancel(self, request_id: str) -> bool:
        """Stop reporting a request; its last update (`finish_reason="cancelled"`) comes with the
        next `step()`. A waiting request leaves the queue; a running one leaves its batch at once
        (its rows are freed). Returns False for an unknown or finished request."""
        live = self.lives.get(request_id)
        if live is None or live.done:
            return False
        if live in self.waiting:
            self.waiting.remove(live)
        self.backend.drop(live)
        self.pending.append(self._finish(live, (), "cancelled", nfe=0))
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.pending or self.backend.lives)

    @owned
    @torch.inference_mode()
    def step(self) -> list[Update]:
        """Admit waiting requests while rows are free, advance every group by one step, report."""
        updates, self.pending = self.pending, []
        self._admit(updates)
        try:
            events = self.backend.step()
        except Exception as err:                  # the batch failed: its requests fail, not the engine
            log.exception("decoding failed")
            events = [Event(live, (), "error", error=first_line(err)) for live in self.backend.fail()]
        for event in events:
            if event.reason is not None:
                updates.append(self._finish(event.live, event.answer, event.reason, event.nfe, event.error,
                                            canvas=event.canvas))
            elif (update := self._progress(event.live, event.answer, event.canvas)) is not None:
                updates.append(update)
        self.steps += 1
        return updates

    def stats(self) -> dict[str, Any]:
        """Counts for health and metrics endpoints (`prefix_cache`: the prefix cache's
        `PrefixStats`, when on)."""
        prefix = {} if self.prefix is None else {"prefix_cache": self.prefix.stats().to_dict()}
        return {**prefix, "waiting": len(self.waiting), "running": sum(not live.done for live in self.backend.lives),
                "rows": self.rows_in_use, "groups": self.backend.batches, "steps": self.steps,
                "max_batch_size": self.max_batch_size}

    @property
    def rows_in_use(self) -> int:
        return self.backend.rows

    # -- internals -----------------------------------------------------------------------------

    def _admit(self, updates: list[Update]) -> None:
        """FIFO admission into free rows: the backend takes the request (a diffusion request joins
        its cache's running batch at that batch's next block boundary)."""
        room = self.max_batch_size - self.rows_in_use
        now = time.perf_counter()
        while room > 0 and self.waiting:
            live = self.waiting.popleft()
            live.started = now
            room -= 1
            try:
                self.backend.add(live)
            except Exception as err:              # a bad request fails alone, not the engine
                log.exception("admitting a request failed")
                updates.append(self._finish(live, (), "error", nfe=0, error=first_line(err)))

    def _decode(self, tokens: Sequence[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True).strip()

    def _progress(self, live: Live, answer: Sequence[int], canvas: Any = None) -> Update | None:
        """The newly final part of a still-running answer, or None when nothing new is sendable.
        Text is held back while it ends in an incomplete character (U+FFFD) or while its decoded
        form does not extend what was sent (a tokenizer merging across the boundary). A
        provisional request (`canvas` given) gets an update every step, with its draft; one
        that does not `follow` its text gets none (its text is decoded once, when it ends)."""
        if canvas is None and not live.request.follow:
            return None
        update = self._new_text(live, answer)
        if canvas is None:
            return update
        update = update or Update(live.request.id)
        return replace(update, draft=self._draft(live, canvas))

    def _new_text(self, live: Live, answer: Sequence[int]) -> Update | None:
        if len(answer) <= live.sent_tokens:
            return None
        text, delta = self._decode(answer), ""
        if text is not None:
            if text.endswith("\ufffd") or not text.startswith(live.sent_text):
                return None
            delta, live.sent_text = text[len(live.sent_text):], text
        new = tuple(answer[live.sent_tokens:])
        live.sent_tokens = len(answer)
        return Update(live.request.id, delta, new)

    def _draft(self, live: Live, canvas: Any, committed_text: str | None = None) -> Draft:
        live.steps += 1
        decode = None if self.tokenizer is None else self.tokenizer.batch_decode
        return draft(canvas, live.steps, live.sent_text if committed_text is None else committed_text, decode)

    def _finish(self, live: Live, answer: Sequence[int], reason: str, nfe: int,
                error: str | None = None, text: str | None = None, canvas: Any = None) -> Update:
        """The request's last update: the rest of its text and its `Output`."""
        if text is None and reason in ("stop", "length"):
            text = self._decode(answer)
        delta = text[len(live.sent_text):] if text is not None and text.startswith(live.sent_text) else ""
        now = time.perf_counter()
        started = live.started or now
        output = Output(text=text, tokens=tuple(answer), prompt_tokens=len(live.request.prompt),
                        nfe=nfe, seconds=now - started, queued=started - live.added,
                        finish_reason=reason, error=error,
                        cached_tokens=0 if self.prefix is None else self.prefix.take(live.request.id))
        live.done = True
        self.lives.pop(live.request.id, None)
        final = None if canvas is None else self._draft(live, canvas, text or "")
        return Update(live.request.id, delta, tuple(answer[live.sent_tokens:]), output, final)


def check_cache(model: Any, config: Any) -> None:
    """Raise the `ValueError` the decode would raise at its first step when `config`'s cache
    cannot run on `model` (a block cache on a model without block-causal attention, a KV cache
    on a model without one, a cache, or a rule's extra forwards, the model's attention back end
    refuses): checked before any work (CLI startup, each server request, each --input line)."""
    from dllm_decode.models.attention import attention_refusal, consult_refusal

    for refusal in (attention_refusal(model, config.cache), consult_refusal(model, config.scheduler)):
        if refusal is not None:
            raise ValueError(refusal)
    config.cache.init_state(model)


HELD_BATCHES = 2
"""Running batches at most per cache configuration whose cache takes no newcomer mid-run
(`Cache.mid_run_joins`): a request that arrives while as many run waits in the oldest one until
its rows are done (then joins with the others waiting there), so a round costs at most this
many forwards per configuration instead of one per arrival."""


class DiffusionBackend(Backend):
    """Every running diffusion request: a `Decoding` per cache configuration (a batch shares
    its cache; more than one while a cache's running batch takes no newcomer,
    `Decoding.accepts_joins`), each request a member with its own record and generator
    (`config.seed`).
    `graphs` (None: eager) is the first `GraphCache` of the pool the running batches draw
    from, one each, and give back when they finish."""

    drafts = True

    def __init__(self, model: Any, tokenizer: Any, graphs: GraphCache | None = None,
                 prefix: PrefixSharing | None = None):
        self.model, self.tokenizer, self.prefix = model, tokenizer, prefix
        self.mode = None if graphs is None else graphs.mode
        self.idle: list[GraphCache] = [] if graphs is None else [graphs]
        self.held: dict[Any, GraphCache] = {}        # a running batch's key -> its graphs
        self.eos_ids = tuple(model.eos_token_ids)
        self.open_id = canvas_of(model).open_id         # [MASK], or the noise canvas's open marker
        self.vocab_size = vocab_size_of(model)
        self.decodings: dict[tuple[Any, int], Decoding] = {}   # (cache, serial) -> running batch
        self.serial = itertools.count()
        self.where: dict[str, Any] = {}               # request id -> its batch's key
        self.lives = []
        self.finished: dict[str, Any] = {}            # the last step's results and failures
        self.failed: dict[str, str] = {}
        self.checked: dict[tuple[int, str | None], Any] = {}   # records that passed `check`

    def check(self, request: Request) -> None:
        """The record's checks against the model, once per record object and adapter: the server
        hands every request that changes nothing in its record the same one (records are
        immutable, the model's adapters fixed), and each is checked twice (admission, `add`)."""
        key = (id(request.config), request.adapter)
        if self.checked.get(key) is request.config:
            return
        check_cache(self.model, request.config)
        check_canvas(self.model, request.config)      # a rule that does not run on its canvas kind
        adapter_index(self.model, request.adapter)
        if self.vocab_size is not None:
            request.config.scheduler.check_fits(self.vocab_size, request.config.gen_length)
        if len(self.checked) >= 64:
            self.checked.clear()
        self.checked[key] = request.config             # held: its id is not reused meanwhile

    @property
    def batches(self) -> int:
        return len(self.decodings)

    def add(self, live: Live) -> None:
        config = live.request.config
        mine = [k for k in self.decodings if k[0] == config.cache]       # oldest first
        key = next((k for k in mine if self.decodings[k].accepts_joins), None)
        if key is None and len(mine) >= HELD_BATCHES:
            key = mine[0]                     # it waits there until that batch's rows are done
        if key is None:
            key = (config.cache, next(self.serial))
            self.decodings[key] = self._start(key)
        decoding = self.decodings[key]
        decoding.add([list(live.request.prompt)], config, key=live.request.id,
                     tokenizer=self.tokenizer, adapter=live.request.adapter)
        if live.request.provisional:
            decoding.proposals[live.request.id] = None
        self.where[live.request.id] = key
        self.lives.append(live)

    def _start(self, key: tuple[Any, int]) -> Decoding:
        """A new running batch for the cache of `key`, with a free `GraphCache` of the pool (a
        new one when every one is held)."""
        cache = key[0]
        if self.mode is None:
            decoding = Decoding(self.model, cache)
            decoding.reuse = None if self.prefix is None else self.prefix.hook(self.model, cache)
            return decoding
        graphs = self.idle.pop() if self.idle else GraphCache(self.mode)
        self.held[key] = graphs
        return Decoding(self.model, cache, capture=graphs)

    def _end(self, key: tuple[Any, int], failed: bool = False) -> None:
        """The batch of `key` is over: its `GraphCache` goes back to the pool (a failed batch's
        is dropped: its buffers may hold a half-written step)."""
        del self.decodings[key]
        graphs = self.held.pop(key, None)
        if graphs is not None and not failed:
            self.idle.append(graphs)

    def drop(self, live: Live) -> None:
        if live in self.lives:
            self._forget(live.request.id)
            self.decodings[self.where.pop(live.request.id)].cancel(live.request.id)
            self.lives.remove(live)

    def _forget(self, key: str) -> None:
        """Stop keeping a request's step proposals (its batch may run on without it)."""
        decoding = self.decodings.get(self.where.get(key))
        if decoding is not None:
            decoding.proposals.pop(key, None)

    def step(self) -> list[Event]:
        """One step of every running batch, then what became final; a batch that raises fails
        its own requests only."""
        self.finished, self.failed = {}, {}
        for batch, decoding in list(self.decodings.items()):
            try:
                for key in decoding.step():
                    self.finished[key] = decoding.result(key)
            except Exception as err:
                log.exception("a running batch failed")
                self.failed.update({key: first_line(err) for key, where in self.where.items()
                                    if where == batch})
                self._end(batch, failed=True)
                continue
            if decoding.finished:
                self._end(batch)
        return self._poll()

    def _poll(self) -> list[Event]:
        events: list[Event] = []
        for live in list(self.lives):
            key = live.request.id
            if key in self.failed:
                self.where.pop(key, None)
                self.lives.remove(live)
                events.append(Event(live, (), "error", error=self.failed[key]))
                continue
            view = None
            if key in self.finished:
                result = self.finished[key]
                tokens, nfe = result.tokens[0].tolist(), int(result.nfe[0])
                final = len(tokens)
                if live.request.provisional:
                    view = canvas(tokens, self.open_id, None, nfe)
                    self._forget(key)
            else:
                decoding = self.decodings[self.where[key]]
                snapshot, lengths = decoding.snapshot(key)
                tokens, final, nfe = snapshot[0].tolist(), int(lengths[0]), None
                found = decoding.proposals.get(key)
                if found is not None:                 # a provisional request that took a step
                    view = canvas(tokens, self.open_id, found, decoding.nfe_of(key))
                    decoding.proposals[key] = None
            prefix = tokens[:final]
            stop = next((i for i, t in enumerate(prefix) if t in self.eos_ids), None)
            answer = prefix if stop is None else prefix[:stop]
            limit = live.request.max_tokens
            if limit is not None and len(answer) >= limit:
                answer, reason = answer[:limit], "length"
            elif stop is not None:
                reason = "stop"
            elif final == len(tokens):
                reason = "length"
            else:
                events.append(Event(live, answer, canvas=view))
                continue
            if nfe is None:                           # final before its rows finished: free them
                decoding = self.decodings[self.where[key]]
                nfe = decoding.nfe_of(key)
                decoding.cancel(key)
                decoding.proposals.pop(key, None)
            self.where.pop(key, None)
            self.lives.remove(live)
            events.append(Event(live, answer, reason, nfe, canvas=view))
        return events

    def fail(self) -> list[Live]:
        self.decodings.clear()
        self.held.clear()
        self.where.clear()
        return super().fail()
