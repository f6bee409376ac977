"""Causal LMs served by an `Engine`: the AR / speculative loop behind the backend contract.

A request's `DecodeConfig` gives the draft-length scheduler, `gen_length` (the token budget),
`temperature` and `seed`; its cache, blocks and filters do not apply. Each request is decoded to
the end in the first step after it was admitted (`speculative_generate` has no step-wise form).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.devices import device_of
from dllm_decode.models.checkpoint import first_line
from dllm_decode.serving import Backend, Event, Live, Request, vocab_size_of

log = logging.getLogger(__name__)


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


class CausalBackend(Backend):
    """Each admitted request on the AR / speculative loop, decoded to the end in one step."""

    def __init__(self, model: SpeculativeModel, tokenizer: Any):
        from dllm_decode.speculative import eos_ids_of

        self.model, self.lives = model, []
        self.eos_ids = eos_ids_of(model.target, tokenizer)
        self.vocab_size = vocab_size_of(model.target)

    def check(self, request: Request) -> None:
        if request.adapter is not None:
            raise ValueError("LoRA adapters are served for diffusion models only")
        spec_config(self.model, request.config)

    def add(self, live: Live) -> None:
        spec_config(self.model, live.request.config)
        self.lives.append(live)

    def step(self) -> list[Event]:
        from dllm_decode.speculative import speculative_generate

        events = []
        for live in list(self.lives):
            self.lives.remove(live)
            request = live.request
            try:                          # one request's failure fails it alone
                result = speculative_generate(
                    self.model.target, list(request.prompt), spec_config(self.model, request.config),
                    self.model.drafter, tokenizer=self.model.tokenizer,
                    generator=torch.Generator(device=device_of(self.model.target)).manual_seed(request.seed))
            except Exception as err:
                log.exception("a causal-LM request failed")
                events.append(Event(live, (), "error", error=first_line(err)))
                continue
            tokens = result.tokens.tolist()
            stop = next((i for i, t in enumerate(tokens) if t in self.eos_ids), None)
            answer = tokens if stop is None else tokens[:stop]
            reason = "stop" if stop is not None else "length"
            if request.max_tokens is not None and len(answer) > request.max_tokens:
                answer, reason = answer[:request.max_tokens], "length"
            events.append(Event(live, answer, reason, result.target_forwards))
        return events


def spec_config(model: SpeculativeModel, config: DecodeConfig) -> Any:
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
