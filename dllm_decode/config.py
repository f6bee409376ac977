"""`DecodeConfig` (what to decode and how) and `DecodeResult` (what came out)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from dllm_decode.interfaces import Scheduler


@dataclass(frozen=True)
class DecodeConfig:
    """One decoding configuration. Change it with `dataclasses.replace`, never by mutation.

    Attributes:
        scheduler: the unmasking policy (required: core never picks one; the CLI defaults to
            `threshold`).
        gen_length: G, canvas length generated after the prompt.
        block_length: semi-autoregressive block length. Must divide `gen_length` unless the
            scheduler chooses its own block bounds (`Scheduler.chooses_block_bounds`).
        temperature: 0 = greedy argmax; > 0 = Gumbel-max sampling in float64 (LLaDA's form),
            confidence still read from the clean softmax.
        stop_at_eos: once a finished block of a row contains an end-of-text token, fill the rest
            of that row with it and stop spending work on the row.
        seed: seed the CLI and eval use to build the `torch.Generator` (library code never seeds
            the global RNG).
    """

    scheduler: Scheduler
    gen_length: int = 128
    block_length: int = 32
    temperature: float = 0.0
    stop_at_eos: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.scheduler, Scheduler):
            raise ValueError(f"scheduler must be a Scheduler instance, got {type(self.scheduler).__name__}")
        if self.gen_length < 1:
            raise ValueError(f"gen_length must be >= 1, got {self.gen_length}")
        if self.block_length < 1:
            raise ValueError(f"block_length must be >= 1, got {self.block_length}")
        if self.block_length > self.gen_length:
            raise ValueError(f"block_length ({self.block_length}) must be <= gen_length ({self.gen_length})")
        adaptive = getattr(self.scheduler, "chooses_block_bounds", False)
        if not adaptive and self.gen_length % self.block_length:
            raise ValueError(f"gen_length ({self.gen_length}) must be a multiple of block_length "
                             f"({self.block_length}) for fixed blocks")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")

    def to_dict(self, names: dict[type, str] | None = None) -> dict[str, Any]:
        """JSON-ready: plain fields, and the scheduler as `{"name": ..., **its fields}`."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "scheduler"}
        out["scheduler"] = component_dict(self.scheduler, names)
        return out


def component_dict(obj: Any, names: dict[type, str] | None = None) -> dict[str, Any]:
    """A frozen-dataclass component as `{"name": registry name, field: value, ...}` (nested ok)."""
    out: dict[str, Any] = {"name": (names or {}).get(type(obj), type(obj).__name__)}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out[f.name] = component_dict(value, names) if dataclasses.is_dataclass(value) else value
    return out


@dataclass
class DecodeResult:
    """What `generate` returns. Per-sample figures are (B,) tensors on the CPU.

    Attributes:
        tokens: (B, G) generated canvas (end-of-text filled after the answer).
        text: decoded answers up to the first end-of-text token (None without a tokenizer).
        nfe: forward passes each sample needed (cache refresh passes included).
        tokens_per_step: G / nfe, ParallelBench's parallelism figure.
        answer_tokens_per_step: tokens up to the first end-of-text / nfe.
        seconds: wall-clock of the whole call.
        trace: per step, on request: `{"step", "block", "rows", "positions", "tokens",
            "confidence"}` with canvas positions relative to the generation start.
    """

    tokens: Tensor
    nfe: Tensor
    answer_lengths: Tensor
    seconds: float
    text: list[str] | None = None
    trace: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def tokens_per_step(self) -> Tensor:
        return self.tokens.shape[1] / self.nfe.clamp_min(1).double()

    @property
    def answer_tokens_per_step(self) -> Tensor:
        return self.answer_lengths.double() / self.nfe.clamp_min(1).double()
