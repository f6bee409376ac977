"""What an `Engine` serves and reports, and the contract of the backends that decode for it.

`Request` is one prompt to decode; `Update` is what `Engine.step` reports for it (newly final
text, and its `Output` at the end). A `Backend` decodes the admitted requests: the diffusion
backend (`dllm_decode.engine`) steps running batches of the one loop, the causal backend
(`dllm_decode.causal_serving`) runs the AR / speculative loop. The engine owns the queue,
admission, streaming and finishing; a backend only decodes and says what became final.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from dllm_decode.config import DecodeConfig
from dllm_decode.prompts import encode_prompts

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
        provisional: report the whole canvas after every step (`Update.draft`), not only the
            answer text that became final.
        adapter: the name of a LoRA adapter the server attached (`adapters.attach`) to decode
            with, unmerged (None: the model's own weights).
        follow: report the answer's text as it becomes final (a stream, stop strings); False:
            only the finished `Output` (no text is decoded while the request runs).
    Raises:
        TypeError: token ids that are not integers (`5.7`, `"5"` and `True` are refused).
        ValueError: an empty id or prompt, a negative token id, `max_tokens` < 1.
    """

    id: str
    prompt: tuple[int, ...]
    config: DecodeConfig
    max_tokens: int | None = None
    provisional: bool = False
    adapter: str | None = None
    follow: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"a request id must be a non-empty string, got {self.id!r}")
        if isinstance(self.prompt, (str, bytes)):
            raise TypeError(f"request {self.id!r}: the prompt must be token ids (integers), got text")
        if not isinstance(self.prompt, Sequence):
            raise TypeError(f"request {self.id!r}: the prompt must be a list of token ids (integers), "
                            f"got {type(self.prompt).__name__}")
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
        if not isinstance(self.provisional, bool):
            raise TypeError(f"request {self.id!r}: provisional must be True or False, got {self.provisional!r}")
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
        cached_tokens: prompt tokens whose K/V came from the engine's prefix cache.
    """

    text: str | None
    tokens: tuple[int, ...]
    prompt_tokens: int
    nfe: int
    seconds: float
    queued: float
    finish_reason: str
    error: str | None = None
    cached_tokens: int = 0


@dataclass(frozen=True)
class Update:
    """What `Engine.step` reports for one request.

    Attributes:
        request_id: the request.
        text: answer text that became final since the last update (append-only; concatenated
            over a request's updates it equals `output.text`).
        tokens: answer tokens that became final since the last update.
        output: set on the request's last update.
        draft: the canvas after this step (`dllm_decode.provisional.Draft`), for a request
            with `provisional` set (every step reports one, even with no new text).
    """

    request_id: str
    text: str = ""
    tokens: tuple[int, ...] = ()
    output: Output | None = None
    draft: Any = None

    @property
    def finished(self) -> bool:
        return self.output is not None


@dataclass
class Live:
    """The engine's bookkeeping of one request: when it was added and started, what was sent."""

    request: Request
    added: float
    started: float = 0.0
    sent_tokens: int = 0
    sent_text: str = ""
    done: bool = False
    steps: int = 0


class Event(NamedTuple):
    """What a backend reports for one request after a step: `answer` tokens that are final (the
    answer so far when `reason` is None, else the whole answer), and when it ended, why
    (`FINISH_REASONS`), its forwards and the error message."""

    live: Live
    answer: tuple[int, ...] | list[int]
    reason: str | None = None
    nfe: int = 0
    error: str | None = None
    canvas: Any = None             # a `provisional.Canvas` and its nfe, for a provisional request


class Backend(abc.ABC):
    """Decodes an engine's admitted requests (`lives`), one `step` at a time.

    Attributes:
        eos_ids: the model's end-of-text ids (an answer ends at the first).
        vocab_size: the model's vocabulary (None when unknown).
        lives: the requests it holds.
    """

    eos_ids: tuple[int, ...]
    vocab_size: int | None
    lives: list[Live]
    drafts: ClassVar[bool] = False
    """Whether it reports provisional canvases (`Request.provisional`)."""

    @abc.abstractmethod
    def check(self, request: Request) -> None:
        """Raise the one-line `ValueError` this backend would raise for the request's config."""

    @abc.abstractmethod
    def add(self, live: Live) -> None:
        """Take a request (it starts at the backend's next chance)."""

    def drop(self, live: Live) -> None:
        """A cancelled request leaves (its rows are freed)."""
        if live in self.lives:
            self.lives.remove(live)

    @abc.abstractmethod
    def step(self) -> list[Event]:
        """Advance every request; report what became final (a finished request leaves)."""

    def fail(self) -> list[Live]:
        """After `step` raised: the requests that fail with it (they leave)."""
        failed, self.lives = [live for live in self.lives if not live.done], []
        return failed

    @property
    def rows(self) -> int:
        """Batch rows in use."""
        return len(self.lives)

    @property
    def batches(self) -> int:
        """Running batches (groups decoded together)."""
        return len(self.lives)


def vocab_size_of(model: object) -> int | None:
    """A model's vocabulary size (its `vocab_size` or its config's), None when it has none."""
    vocab = getattr(model, "vocab_size", None)
    if vocab is None:
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None
