"""`Engine`: many requests served by the one loop, one denoising step at a time.

Requests wait in a FIFO queue and are admitted while the engine has free rows (`max_batch_size`).
Diffusion requests join one running batch per cache configuration (`dllm_decode.sampler.Decoding`:
a request joins between blocks with its own decode record, generator and lengths, and leaves
when done). `step()` advances every running batch by one denoising step and reports per request
the answer text that became final (for streaming) and, as soon as a request's answer can no
longer change, its final result: first done, first out (SGLang's `--dllm-fdfo`, spec serving.md
§1.1); its row leaves the batch at once.

A request's answer is final when its row has no mask left, when an end-of-text token lies in its
final prefix (everything before the first masked column: no later step can change it), or when
that prefix holds `max_tokens` answer tokens. Answers equal `generate` on the request alone,
greedy or sampled: a batch's rows do not interact (padding is masked, random draws are per row).

The engine is not thread-safe: one thread owns it (the server's worker). Causal LMs (the AR and
speculative baseline) are served through `SpeculativeModel`, one request per group, each decoded
to the end in one step (`speculative_generate` has no step-wise form).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.models.checkpoint import first_line
from dllm_decode.prompts import encode_prompts
from dllm_decode.sampler import Decoding

log = logging.getLogger(__name__)

FINISH_REASONS = ("stop", "length", "cancelled", "error")
"""`stop`: an end-of-text token ended the answer; `length`: the canvas or `max_tokens` ran out;
`cancelled`: `Engine.cancel`; `error`: the decode raised (the message is in `Output.error`)."""


@dataclass(frozen=True)
class Request:
    """One prompt to decode.

    Attributes:
        id: unique among the engine's requests in flight.
        prompt: token ids (chat template already applied).
        config: how to decode it, its seed included (`config.seed`).
        max_tokens: cut the answer after this many tokens (None: the canvas, `gen_length`).
    Raises:
        TypeError: token ids that are not integers (`5.7`, `"5"` and `True` are refused).
        ValueError: an empty id or prompt, a negative token id, `max_tokens` < 1.
    """

    id: str
    prompt: tuple[int, ...]
    config: DecodeConfig
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"a request id must be a non-empty string, got {self.id!r}")
        if isinstance(self.prompt, (str, bytes)):
            raise TypeError(f"request {self.id!r}: the prompt must be token ids (integers), got text")
        try:                             # the one token-id check `generate` and `Decoding` use
            (prompt,) = encode_prompts([list(self.prompt)], None)
        except (TypeError, ValueError) as err:
            raise type(err)(f"request {self.id!r}: {err}".replace("prompt 0 ", "the prompt ")) from None
        if min(prompt) < 0:
            raise ValueError(f"request {self.id!r}: token ids must be >= 0, got {min(prompt)}")
        object.__setattr__(self, "prompt", tuple(prompt))
        if not isinstance(self.config, DecodeConfig):
            raise TypeError(f"request {self.id!r}: config must be a DecodeConfig, got "
                            f"{type(self.config).__name__}")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or self.max_tokens < 1):
            raise ValueError(f"request {self.id!r}: max_tokens must be >= 1 or None, got {self.max_tokens!r}")

    @property
    def seed(self) -> int:
        return self.config.seed


@dataclass(frozen=True)
class Output:
    """A finished request.

    Attributes:
        text: the answer (decoded without special tokens, stripped; None without a tokenizer).
        tokens: the answer's tokens (up to the first end-of-text, cut at `max_tokens`).
        prompt_tokens: the prompt's length.
        nfe: model forward passes its group ran until the answer was final.
        seconds: from admission to the final answer.
        queued: seconds spent waiting for admission.
        finish_reason: one of `FINISH_REASONS`.
        error: the error message when `finish_reason == "error"`.
    """

    text: str | None
    tokens: tuple[int, ...]
    prompt_tokens: int
    nfe: int
    seconds: float
    queued: float
    finish_reason: str
    error: str | None = None


@dataclass(frozen=True)
class Update:
    """What `Engine.step` reports for one request.

    Attributes:
        request_id: the request.
        text: answer text that became final since the last update (append-only; concatenated
            over a request's updates it equals `output.text`).
        tokens: answer tokens that became final since the last update.
        output: set on the request's last update.
    """

    request_id: str
    text: str = ""
    tokens: tuple[int, ...] = ()
    output: Output | None = None

    @property
    def finished(self) -> bool:
        return self.output is not None


@dataclass(frozen=True)
class SpeculativeModel:
    """A causal LM served by the AR / speculative loop (`dllm_decode.speculative`).

    Attributes:
        target: the verifying causal LM (with `.tokenizer`).
        drafter: proposes tokens (None: plain AR).
        max_draft: the most tokens drafted per round.
    A request's `DecodeConfig` gives the draft-length scheduler, `gen_length` (the token budget),
    `temperature` and `seed`; its cache, blocks and filters do not apply.
    """

    target: Any
    drafter: Any = None
    max_draft: int = 8

    @property
    def tokenizer(self) -> Any:
        return getattr(self.target, "tokenizer", None)

    @property
    def max_length(self) -> int | None:
        from dllm_decode.speculative.loop import context_of

        return context_of(self.target)


@dataclass
class _Live:
    """Engine-side bookkeeping of one request."""

    request: Request
    added: float
    started: float = 0.0
    sent_tokens: int = 0
    sent_text: str = ""
    done: bool = False


def check_cache(model: Any, config: Any) -> None:
    """Raise the `ValueError` the decode would raise at its first step when `config`'s cache
    cannot run on `model` (a block cache on a model without block-causal attention, a KV cache
    on a model without one): checked before any work (CLI startup, each server request)."""
    config.cache.init_state(model)


def _vocab_size(model: Any) -> int | None:
    target = model.target if isinstance(model, SpeculativeModel) else model
    vocab = getattr(target, "vocab_size", None)
    if vocab is None:
        vocab = getattr(getattr(target, "config", None), "vocab_size", None)
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None


class Engine:
    """Continuous batching over the one denoising loop (see the module docstring).

    Args:
        model: a DiffusionLM, or a `SpeculativeModel` for a causal LM.
        tokenizer: decodes answers (default `model.tokenizer`; None: token ids only).
        max_batch_size: rows decoded at once across all groups; waiting requests are admitted
            in arrival order as rows free up.
    Raises:
        ValueError: `max_batch_size` < 1.
    """

    def __init__(self, model: Any, tokenizer: Any = None, max_batch_size: int = 8):
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        self.max_batch_size = max_batch_size
        self.speculative = isinstance(model, SpeculativeModel)
        self.eos_ids = self._eos_ids()
        self.waiting: collections.deque[_Live] = collections.deque()
        self.groups: list[_Group] = [] if self.speculative else [_DiffusionBatches(self)]
        self.lives: dict[str, _Live] = {}
        self.pending: list[Update] = []          # cancellations, reported by the next step
        self.steps = 0

    # -- the API -------------------------------------------------------------------------------

    def check(self, request: Request) -> None:
        """Raise the one-line `ValueError` `add` would raise for this request's content (the
        id aside). Reads no engine state, so another thread may call it.

        Raises:
            ValueError: prompt plus generation longer than the model's context; a token id
                outside the vocabulary; a cache the model cannot use, or scheduler ids it does
                not have (`Scheduler.check_fits`); a decode record this model cannot run.
        """
        limit = getattr(self.model, "max_length", None)
        total = len(request.prompt) + request.config.gen_length
        if limit is not None and total > limit:
            raise ValueError(f"prompt ({len(request.prompt)} tokens) + gen_length "
                             f"({request.config.gen_length}) exceeds the model's context of {limit} tokens")
        vocab = _vocab_size(self.model)
        if vocab is not None and (bad := next((t for t in request.prompt if not 0 <= t < vocab), None)) is not None:
            raise ValueError(f"the prompt holds token id {bad}, outside the vocabulary [0, {vocab})")
        if self.speculative:
            _spec_config(self.model, request.config)
        else:
            check_cache(self.model, request.config)
            if vocab is not None:
                request.config.scheduler.check_fits(vocab, request.config.gen_length)

    def add(self, request: Request) -> None:
        """Queue a request.

        Raises:
            ValueError: an id already in flight, or what `check` raises.
        """
        if request.id in self.lives:
            raise ValueError(f"request id {request.id!r} is already in flight")
        self.check(request)
        live = _Live(request, added=time.perf_counter())
        self.lives[request.id] = live
        self.waiting.append(live)

    def cancel(self, request_id: str) -> bool:
        """Stop reporting a request; its last update (`finish_reason="cancelled"`) comes with the
        next `step()`. A waiting request leaves the queue; a running one stops counting once its
        Returns False for an unknown or finished request."""
        live = self.lives.get(request_id)
        if live is None or live.done:
            return False
        if live in self.waiting:
            self.waiting.remove(live)
        for group in self.groups:
            group.drop(live)
        self.pending.append(self._finish(live, (), "cancelled", nfe=0))
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.pending or any(g.lives for g in self.groups))

    @torch.inference_mode()
    def step(self) -> list[Update]:
        """Admit waiting requests while rows are free, advance every group by one step, report."""
        updates, self.pending = self.pending, []
        self._admit(updates)
        for group in list(self.groups):
            try:
                group.step()
                updates += group.poll(self)
            except Exception as err:              # one group's failure must not stop the others
                log.exception("decoding group failed")
                for live in group.fail():
                    updates.append(self._finish(live, (), "error", nfe=0, error=first_line(err)))
            if self.speculative and all(live.done for live in group.lives):
                self.groups.remove(group)
        self.steps += 1
        return updates

    def stats(self) -> dict[str, int]:
        """Counts for health and metrics endpoints."""
        return {"waiting": len(self.waiting), "running": sum(not live.done for g in self.groups for live in g.lives),
                "rows": self.rows_in_use, "groups": sum(g.batches for g in self.groups), "steps": self.steps,
                "max_batch_size": self.max_batch_size}

    @property
    def rows_in_use(self) -> int:
        return sum(group.rows for group in self.groups)

    # -- internals -----------------------------------------------------------------------------

    def _eos_ids(self) -> tuple[int, ...]:
        if self.speculative:
            from dllm_decode.speculative import eos_ids_of

            return eos_ids_of(self.model.target, self.tokenizer)
        return tuple(self.model.eos_token_ids)

    def _admit(self, updates: list[Update]) -> None:
        """FIFO admission into free rows: a diffusion request joins its cache's running batch
        (at that batch's next block boundary); a causal-LM request gets a group of its own."""
        room = self.max_batch_size - self.rows_in_use
        now = time.perf_counter()
        while room > 0 and self.waiting:
            live = self.waiting.popleft()
            live.started = now
            room -= 1
            try:
                if self.speculative:
                    self.groups.append(_SpeculativeGroup(self, [live]))
                else:
                    self.groups[0].add(live)
            except Exception as err:              # a bad request fails alone, not the engine
                log.exception("admitting a request failed")
                updates.append(self._finish(live, (), "error", nfe=0, error=first_line(err)))

    def _decode(self, tokens: Sequence[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True).strip()

    def _progress(self, live: _Live, answer: Sequence[int]) -> Update | None:
        """The newly final part of a still-running answer, or None when nothing new is sendable.
        Text is held back while it ends in an incomplete character (U+FFFD) or while its decoded
        form does not extend what was sent (a tokenizer merging across the boundary)."""
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

    def _finish(self, live: _Live, answer: Sequence[int], reason: str, nfe: int,
                error: str | None = None, text: str | None = None) -> Update:
        """The request's last update: the rest of its text and its `Output`."""
        if text is None and reason in ("stop", "length"):
            text = self._decode(answer)
        delta = text[len(live.sent_text):] if text is not None and text.startswith(live.sent_text) else ""
        now = time.perf_counter()
        started = live.started or now
        output = Output(text=text, tokens=tuple(answer), prompt_tokens=len(live.request.prompt),
                        nfe=nfe, seconds=now - started, queued=started - live.added,
                        finish_reason=reason, error=error)
        live.done = True
        self.lives.pop(live.request.id, None)
        return Update(live.request.id, delta, tuple(answer[live.sent_tokens:]), output)


class _Group:
    """Requests being decoded; `rows` is how many batch rows they occupy."""

    lives: list[_Live]
    rows: int
    batches: int = 1

    def step(self) -> None:
        raise NotImplementedError

    def poll(self, engine: Engine) -> list[Update]:
        raise NotImplementedError

    def drop(self, live: _Live) -> None:
        """A cancelled request leaves (its rows are freed)."""

    def fail(self) -> list[_Live]:
        """After `step` or `poll` raised: the requests that fail with it (they leave)."""
        failed, self.lives = [live for live in self.lives if not live.done], []
        return failed


class _DiffusionBatches(_Group):
    """Every running diffusion request: one `Decoding` per cache configuration (a batch shares
    its cache), each request a member with its own record and generator (`config.seed`)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.decodings: dict[Any, Decoding] = {}
        self.where: dict[str, Any] = {}               # request id -> its batch's cache
        self.lives = []

    @property
    def rows(self) -> int:                           # type: ignore[override]
        return len(self.lives)

    @property
    def batches(self) -> int:                        # type: ignore[override]
        return len(self.decodings)

    def add(self, live: _Live) -> None:
        config = live.request.config
        decoding = self.decodings.get(config.cache) or Decoding(self.engine.model, config.cache)
        decoding.add([list(live.request.prompt)], config, key=live.request.id,
                     tokenizer=self.engine.tokenizer)
        self.decodings[config.cache] = decoding
        self.where[live.request.id] = config.cache
        self.lives.append(live)

    def drop(self, live: _Live) -> None:
        if live in self.lives:
            self.decodings[self.where.pop(live.request.id)].cancel(live.request.id)
            self.lives.remove(live)

    def step(self) -> None:
        """One step of every running batch; a batch that raises fails its own requests only."""
        self.finished: dict[str, Any] = {}
        self.failed: dict[str, str] = {}
        for cache, decoding in list(self.decodings.items()):
            try:
                for key in decoding.step():
                    self.finished[key] = decoding.result(key)
            except Exception as err:
                log.exception("a running batch failed")
                self.failed.update({key: first_line(err) for key, where in self.where.items()
                                    if where == cache})
                del self.decodings[cache]
                continue
            if decoding.finished:
                del self.decodings[cache]

    def poll(self, engine: Engine) -> list[Update]:
        updates: list[Update] = []
        for live in list(self.lives):
            key = live.request.id
            if key in self.failed:
                self.where.pop(key, None)
                self.lives.remove(live)
                updates.append(engine._finish(live, (), "error", nfe=0, error=self.failed[key]))
                continue
            if key in self.finished:
                result = self.finished[key]
                tokens, nfe = result.tokens[0].tolist(), int(result.nfe[0])
                final = len(tokens)
            else:
                snapshot, lengths = self.decodings[self.where[key]].snapshot(key)
                tokens, final, nfe = snapshot[0].tolist(), int(lengths[0]), None
            prefix = tokens[:final]
            stop = next((i for i, t in enumerate(prefix) if t in engine.eos_ids), None)
            answer = prefix if stop is None else prefix[:stop]
            limit = live.request.max_tokens
            if limit is not None and len(answer) >= limit:
                answer, reason = answer[:limit], "length"
            elif stop is not None:
                reason = "stop"
            elif final == len(tokens):
                reason = "length"
            else:
                update = engine._progress(live, answer)
                if update is not None:
                    updates.append(update)
                continue
            if nfe is None:                           # final before its rows finished: free them
                decoding = self.decodings[self.where[key]]
                nfe = decoding.nfe_of(key)
                decoding.cancel(key)
            self.where.pop(key, None)
            self.lives.remove(live)
            updates.append(engine._finish(live, answer, reason, nfe=nfe))
        return updates

    def fail(self) -> list[_Live]:
        self.decodings.clear()
        self.where.clear()
        return super().fail()


class _SpeculativeGroup(_Group):
    """One request on the AR / speculative loop, decoded to the end in its first step."""

    def __init__(self, engine: Engine, lives: list[_Live]):
        (self.live,) = self.lives = lives
        self.rows = 1
        self.model: SpeculativeModel = engine.model
        self.config = _spec_config(self.model, self.live.request.config)
        self.result: Any = None

    def step(self) -> None:
        from dllm_decode.speculative import speculative_generate
        from dllm_decode.speculative.kv import _device_of

        request = self.live.request
        device = _device_of(self.model.target)
        self.result = speculative_generate(
            self.model.target, list(request.prompt), self.config, self.model.drafter,
            generator=torch.Generator(device=device).manual_seed(request.seed),
            tokenizer=self.model.tokenizer)

    def poll(self, engine: Engine) -> list[Update]:
        tokens = self.result.tokens.tolist()
        stop = next((i for i, t in enumerate(tokens) if t in engine.eos_ids), None)
        answer = tokens if stop is None else tokens[:stop]
        limit = self.live.request.max_tokens
        reason = "stop" if stop is not None else "length"
        if limit is not None and len(answer) > limit:
            answer, reason = answer[:limit], "length"
        self.rows = 0
        return [engine._finish(self.live, answer, reason, nfe=self.result.target_forwards)]


def _spec_config(model: SpeculativeModel, config: DecodeConfig) -> Any:
    """The speculative loop's record for a decode record (the budget is `gen_length`).

    Raises:
        ValueError: a scheduler the AR mode cannot drive, or filters (they act on a canvas).
    """
    from dllm_decode.speculative import Sampling, SpecConfig

    if config.filters:
        raise ValueError("filters act on a diffusion canvas; a causal LM takes none")
    return SpecConfig(scheduler=config.scheduler, max_new_tokens=config.gen_length,
                      max_draft=model.max_draft, sampling=Sampling(temperature=config.temperature),
                      stop_at_eos=config.stop_at_eos)

