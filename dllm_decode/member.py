"""The request side of a running batch: `Member` (one request's rows, config, generator, output
and trace), the checks a request and a `Decoding` pass before any work, and the one-thread guard.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.interfaces import Cache
from dllm_decode.noise import check_canvas
from dllm_decode.prompts import encode_prompts


@dataclass
class Member:
    """One request in the running batch: B prompts decoded under one config with one generator.

    Attributes:
        key: the caller's name for it (returned by `Decoding.step` when it finishes).
        config: how its rows decode (scheduler, filters, lengths, temperature, EOS policy).
        generator: its only source of randomness.
        tokenizer: encodes its string prompts and decodes its answers.
        out: (n, P + G) its rows' final canvases, prompts right-aligned at column P.
        nfe: (n,) forwards each row took part in with work to do (a rule's look-ahead calls
            included).
        forward_rows: (n,) canvas rows those forwards processed for each row.
        guide_nfe: (n,) forwards of the rule's causal guide for each row.
        memory: what the loop's extra forwards keep for it across steps (the guide's cache).
        trace: per step, its rows' commits (when requested).
        state: its scheduler's state for its rows still decoding, in batch order.
        live: its rows still decoding.
        cancelled: dropped by the caller (it has no result).
        adapter: the index of the unmerged LoRA adapter its rows decode with (`adapters`), -1 none.
    """

    key: Hashable
    config: DecodeConfig
    generator: torch.Generator
    tokenizer: Any
    out: Tensor
    nfe: Tensor
    trace: list[dict[str, Any]] | None
    state: Any = None
    live: int = 0
    cancelled: bool = False
    started: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0
    forward_rows: Tensor | None = None
    guide_nfe: Tensor | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    adapter: int = -1                       # its unmerged LoRA adapter's index (-1: none)
    noise: Any = None                       # its noise canvas (`noise_turn.NoiseRows`), if any

    def __post_init__(self) -> None:
        if self.forward_rows is None:
            self.forward_rows = self.nfe.clone()
        if self.guide_nfe is None:
            self.guide_nfe = torch.zeros_like(self.nfe)

    @property
    def gen_length(self) -> int:
        return self.config.gen_length

    @property
    def stops_at_eos(self) -> bool:
        """A row leaves at its end of text by itself (a noise canvas ends its rows together)."""
        return self.config.stop_at_eos and self.noise is None

    @property
    def revises(self) -> str:
        return self.config.scheduler.revises

    def result(self, eos_ids: tuple[int, ...]) -> DecodeResult:
        """Its `DecodeResult`: tokens, answer lengths (up to the first end-of-text), text."""
        tokens = self.out[:, -self.gen_length:].cpu()
        is_eos = torch.isin(tokens, torch.tensor(eos_ids))
        answer_lengths = torch.where(is_eos.any(-1), is_eos.int().argmax(-1), tokens.shape[1])
        text = None
        if self.tokenizer is not None:
            text = [self.tokenizer.decode(row[:n].tolist(), skip_special_tokens=True).strip()
                    for row, n in zip(tokens, answer_lengths.tolist())]
        return DecodeResult(tokens=tokens, nfe=self.nfe.cpu(), answer_lengths=answer_lengths,
                            seconds=self.seconds, text=text, trace=self.trace,
                            forward_rows=self.forward_rows.cpu(), guide_nfe=self.guide_nfe.cpu())


class OneThread:
    """A guard for an object one thread must own: entering it while another thread is inside
    raises `RuntimeError` at once (calls are refused, not serialised: a second thread stepping
    the same batch is a bug in the caller, and waiting would hide it)."""

    def __init__(self, what: str):
        self.what, self.lock = what, threading.Lock()

    def __enter__(self) -> None:
        if not self.lock.acquire(blocking=False):
            raise RuntimeError(f"{self.what} is in use by another thread: one thread must own it "
                               f"(give it to one worker, or serialise the calls yourself)")

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def owned(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a method inside its object's `OneThread` guard (`self._owner`)."""
    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._owner:
            return method(self, *args, **kwargs)
    return guarded


def check_decoding(model: Any, cache: Any, trace: Any) -> None:
    """`Decoding`'s arguments: a model with the `DiffusionLM` attributes, a `Cache`, a bool."""
    missing = [a for a in ("mask_token_id", "eos_token_ids", "vocab_size", "forward") if not hasattr(model, a)]
    if missing:
        raise TypeError(f"model must be a DiffusionLM (dllm_decode.interfaces); "
                        f"{type(model).__name__} lacks {missing}")
    if not isinstance(cache, Cache):
        raise TypeError(f"cache must be a Cache instance, got {type(cache).__name__}")
    if not isinstance(trace, bool):
        raise TypeError(f"trace must be True or False, got {type(trace).__name__} {trace!r}")
    from dllm_decode.models.attention import attention_refusal

    if (refusal := attention_refusal(model, cache)) is not None:
        raise ValueError(refusal)


def check_request(model: Any, cache: Any, prompts: Any, config: DecodeConfig, generator: Any,
                  tokenizer: Any) -> tuple[list[list[int]], Any]:
    """A request's arguments checked before any work: its prompts' token ids and its tokenizer.

    Raises:
        TypeError: a config, generator or tokenizer of the wrong kind; token ids that are not
            integers.
        ValueError: empty prompt, a token id outside the vocabulary, prompt plus generation
            longer than the model's context, a cache other than the batch's, or blocks a
            block-diffusion model cannot decode.
    """
    grid = getattr(model, "block_size", None)
    if not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if config.cache != cache:
        raise ValueError(f"this batch decodes with cache {cache!r}; a request with "
                         f"{config.cache!r} needs a batch of its own")
    if grid is not None and (grid % config.block_length or config.scheduler.chooses_block_bounds):
        raise ValueError(f"this block-diffusion model decodes blocks of {grid} positions: "
                         f"block_length must divide {grid} (sub-blocks; got "
                         f"{config.block_length}) and the scheduler cannot choose block bounds")
    if tokenizer is not None and not (callable(tokenizer) and hasattr(tokenizer, "decode")):
        raise TypeError(f"tokenizer must be a tokenizer (callable, with decode), got "
                        f"{type(tokenizer).__name__} {tokenizer!r}")
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    check_canvas(model, config)                 # the rule runs on this model's canvas kind
    from dllm_decode.models.attention import consult_refusal

    if (refusal := consult_refusal(model, config.scheduler)) is not None:
        raise ValueError(refusal)
    ids = encode_prompts(prompts, tokenizer, model.vocab_size, model.mask_token_id)
    config.scheduler.check_fits(int(model.vocab_size), config.gen_length)
    if config.scheduler.guide is not None:          # a guide that cannot serve this model: now
        from dllm_decode.guide import load_guide

        load_guide(config.scheduler.guide, model)
    check_context(model, max(len(row) for row in ids), config.gen_length)
    return ids, tokenizer


def check_context(model: Any, prompt_length: int, gen_length: int) -> None:
    """Raise a one-line ValueError when a prompt of `prompt_length` tokens and `gen_length`
    generated ones do not fit the model's context (`max_length`; no limit when it is None).

    A block-diffusion model (`block_size`) decodes whole blocks of its grid: the canvas runs to
    the next grid boundary past prompt + generation (`models.block_grid.grid_tails`), and that
    tail must fit too. Every entry point (`generate`, `Decoding`, the CLIs, the server's engine,
    self-speculation) checks requests here.
    """
    limit = getattr(model, "max_length", None)
    if limit is None:
        return
    grid = getattr(model, "block_size", None) or 1
    total = prompt_length + gen_length
    canvas = -(-total // grid) * grid
    if canvas <= limit:
        return
    if canvas == total:
        raise ValueError(f"prompt ({prompt_length} tokens) + gen_length ({gen_length}) exceeds "
                         f"the model's context of {limit} tokens")
    fits = limit // grid * grid - prompt_length
    room = f"gen_length {fits} at most fits" if fits > 0 else "no generation fits after this prompt"
    raise ValueError(f"prompt ({prompt_length} tokens) + gen_length ({gen_length}) decodes on "
                     f"whole blocks of {grid}, {canvas} positions, which exceeds the model's "
                     f"context of {limit} tokens ({room})")
