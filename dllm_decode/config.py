"""`DecodeConfig` (how to decode: the one record) and `DecodeResult` (what came out)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.fields import check_types
from dllm_decode.interfaces import Cache, Filter, NoCache, Scheduler
from dllm_decode.registry import component, component_dict

PLAIN_FIELDS = ("gen_length", "block_length", "temperature", "stop_at_eos", "seed")
REVISION_SCOPES = ("none", "block", "generated")


def accepts_cache(scheduler: Scheduler, cache: Cache | str) -> bool:
    """Whether `scheduler` runs under `cache` (an instance or its registry name): only `none` for
    a rule that takes back earlier blocks, else its declared `caches` (None: any)."""
    if scheduler.revises == "generated":
        return cache == "none" if isinstance(cache, str) else isinstance(cache, NoCache)
    if scheduler.caches is None:
        return True
    return (cache if isinstance(cache, str) else cache_name(cache)) in scheduler.caches


def cache_name(cache: Cache) -> str:
    """A cache's registry name (its class name when it is not registered)."""
    try:
        return str(component_dict(cache)["name"])
    except (KeyError, ValueError, TypeError):
        return type(cache).__name__


MAX_FILTERS = 16
"""The most filters one decode record chains (each runs on every step)."""


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode, all of it: the record the CLI, eval, bench, presets, the lm-eval adapter
    and the server build from, and the JSON every result carries. Change it with
    `dataclasses.replace`, never by mutation.

    Attributes:
        scheduler: the unmasking policy (required: core never picks one; the CLI defaults to
            `threshold`).
        cache: how the loop gets logits (default `NoCache()`: a full forward every step).
        filters: applied after the scheduler, in order.
        gen_length: G, canvas length generated after the prompt.
        block_length: semi-autoregressive block length. Must divide `gen_length` unless the
            scheduler chooses its own block bounds (`Scheduler.chooses_block_bounds`).
        temperature: 0 = greedy argmax; > 0 = Gumbel-max sampling in float64 (LLaDA's form),
            confidence still read from the clean softmax.
        stop_at_eos: once a finished block of a row contains an end-of-text token, fill the rest
            of that row with it and stop spending work on the row.
        seed: seeds the `torch.Generator` of a `generate` call that is given none (library code
            never seeds the global RNG).
    Raises:
        ValueError: a value out of range, naming the field (`TypeError` for a part of the wrong
            kind).
    """

    scheduler: Scheduler
    cache: Cache = field(default_factory=NoCache)
    filters: tuple[Filter, ...] = ()
    gen_length: int = 128
    block_length: int = 32
    temperature: float = 0.0
    stop_at_eos: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.filters, (str, bytes)) or not isinstance(self.filters, Sequence):
            raise TypeError(f"filters must be a list of Filter instances, got {type(self.filters).__name__}")
        if not isinstance(self.filters, tuple):
            object.__setattr__(self, "filters", tuple(self.filters))
        if len(self.filters) > MAX_FILTERS:             # each runs every step: a bounded chain
            raise ValueError(f"filters may hold at most {MAX_FILTERS}, got {len(self.filters)}")
        for name, value, kind in (("scheduler", self.scheduler, Scheduler), ("cache", self.cache, Cache),
                                  *(("filters", f, Filter) for f in self.filters)):
            if not isinstance(value, kind):
                raise TypeError(f"{name} must be a {kind.__name__} instance, got {type(value).__name__}")
        check_types(self)                   # stop_at_eos a bool, the counts integers, ...
        for name in ("gen_length", "block_length", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
        if self.gen_length < 1:
            raise ValueError(f"gen_length must be >= 1, got {self.gen_length}")
        if self.block_length < 1:
            raise ValueError(f"block_length must be >= 1, got {self.block_length}")
        if self.block_length > self.gen_length:
            raise ValueError(f"block_length ({self.block_length}) must be <= gen_length ({self.gen_length})")
        if not self.scheduler.chooses_block_bounds and self.gen_length % self.block_length:
            raise ValueError(f"gen_length ({self.gen_length}) must be a multiple of block_length "
                             f"({self.block_length}) for fixed blocks")
        self.scheduler.check_config(self)
        if self.scheduler.revises not in REVISION_SCOPES:
            raise ValueError(f"scheduler {type(self.scheduler).__name__} declares revises="
                             f"{self.scheduler.revises!r}; accepted: {list(REVISION_SCOPES)}")
        if self.scheduler.revises == "generated" and not isinstance(self.cache, NoCache):
            raise ValueError(f"{type(self.scheduler).__name__} takes back tokens of earlier blocks, "
                             f"which no block cache can follow; use cache 'none'")
        if not accepts_cache(self.scheduler, self.cache):
            raise ValueError(f"{type(self.scheduler).__name__} runs only under the caches "
                             f"{list(self.scheduler.caches)}, not {cache_name(self.cache)!r}; "
                             f"use cache 'none'")
        if not 0 <= self.seed < 2 ** 63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool):
            raise TypeError(f"temperature must be a number, got {type(self.temperature).__name__}")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: each part as `{"name": registry name, field: value, ...}`, plain fields
        as they are. `DecodeConfig.from_dict` reads it back."""
        return {"scheduler": component_dict(self.scheduler), "cache": component_dict(self.cache),
                "filters": [component_dict(f) for f in self.filters],
                **{name: getattr(self, name) for name in PLAIN_FIELDS}}

    @classmethod
    def for_model(cls, model: Any, gen_length: int = 128) -> DecodeConfig:
        """The decoding `model`'s checkpoint ships with, for `gen_length` tokens: its own
        `generation_config.json` settings, else its family's reference `generate` defaults
        (`dllm_decode.shipped`; a uniform-noise model rounds `gen_length` up to whole canvases).

        Raises:
            ValueError: a family with no known shipped decoding, or settings out of range.
        """
        from dllm_decode.shipped import shipped_decoding

        return cls.from_dict(shipped_decoding(model, gen_length))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecodeConfig:
        """Build from `to_dict` output or a hand-written equivalent: a part may be a registry
        name, a `{"name": ..., field: value}` mapping (values may be text, dotted keys configure
        nested parts) or an object; absent keys take the defaults (the scheduler is required).

        Raises:
            ValueError: unknown keys, names or options, or a value out of range, naming it.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"a decode config must be a mapping, got {type(data).__name__}")
        unknown = set(data) - {"scheduler", "cache", "filters", *PLAIN_FIELDS}
        if unknown:
            raise ValueError(f"unknown decode-config key(s) {sorted(unknown)}; valid: "
                             f"{['scheduler', 'cache', 'filters', *PLAIN_FIELDS]}")
        if "scheduler" not in data:
            raise ValueError("a decode config needs a scheduler")
        filters = data.get("filters", ())
        if isinstance(filters, (str, Mapping)) or not isinstance(filters, (list, tuple)):
            raise ValueError(f"filters must be a list, got {filters!r}")
        parts = {"scheduler": component("scheduler", data["scheduler"]),
                 "cache": component("cache", data.get("cache", "none")),
                 "filters": tuple(component("filter", f) for f in filters)}
        return cls(**parts, **{name: data[name] for name in PLAIN_FIELDS if name in data})


@dataclass
class DecodeResult:
    """What `generate` returns. Per-sample figures are (B,) tensors on the CPU.

    Attributes:
        tokens: (B, G) generated canvas (end-of-text filled after the answer).
        nfe: forward passes each sample needed (cache refresh passes included).
        answer_lengths: tokens before the first end-of-text, per sample.
        seconds: wall-clock of the whole call.
        text: decoded answers up to the first end-of-text token (None without a tokenizer).
        trace: per step, on request: `{"rows", "offset", "commit", "tokens", "confidence",
            "block_step"}`: the batch rows that took part, the window's first column relative to
            the generation start, and (rows, window) tensors of the step's commits, the tokens
            written, and the confidence of each eligible column (-inf elsewhere).
        forward_rows: canvas rows each sample's forwards processed (equal to `nfe` except for a
            rule with a look-ahead, whose look-ahead call runs one row per candidate).
        guide_nfe: forwards of a rule's causal guide model per sample (0 without one); not in
            `nfe`, which counts the dLLM's forwards.
    """

    tokens: Tensor
    nfe: Tensor
    answer_lengths: Tensor
    seconds: float
    text: list[str] | None = None
    trace: list[dict[str, Any]] | None = field(default=None, repr=False)
    forward_rows: Tensor | None = None
    guide_nfe: Tensor | None = None

    def __post_init__(self) -> None:
        if self.forward_rows is None:
            self.forward_rows = self.nfe.clone()
        if self.guide_nfe is None:
            self.guide_nfe = torch.zeros_like(self.nfe)

    @property
    def tokens_per_step(self) -> Tensor:
        """G / NFE: ParallelBench's parallelism figure (the canvas, EOS padding included)."""
        return self.tokens.shape[1] / self.nfe.clamp_min(1).double()

    def to_html(self, tokenizer: Any = None, prompts: list[str] | None = None) -> str:
        """One self-contained HTML page replaying this decode step by step (needs `trace=True`);
        `dllm_decode.viz.html` draws it."""
        from dllm_decode.viz.html import result_html

        return result_html(self, tokenizer, prompts)

    @property
    def answer_tokens_per_step(self) -> Tensor:
        """Tokens up to the first end-of-text / NFE: the speed a reader of the answer sees."""
        return self.answer_lengths.double() / self.nfe.clamp_min(1).double()

