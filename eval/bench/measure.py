"""Decoding under the interleaved timer: `Combo` (a labelled `DecodeConfig`) and `run_grid`.

Every combo decodes its chunks of samples through `timing.interleave`; a decode records its
wall-clock, the seconds inside model forwards and the `DecodeResult` (NFE, answer lengths, text).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.eval.bench.timing import Runs, forward_timer, interleave
from dllm_decode.sampler import generate


@dataclass(frozen=True)
class Sample:
    """One prompt of a benchmark: its task name and (for scored tasks) the example."""

    task: str
    prompt: str | list[int]
    example: Any = None


@dataclass(frozen=True)
class Combo:
    """One labelled decode record of a benchmark.

    Attributes:
        label: the row name in tables and JSON.
        config: how to decode (scheduler, cache, filters, lengths).
        oracle: decode with the Learn2PD oracle (arXiv 2509.25188), whose reference is the
            chunk's output under the `reference` combo; `config.scheduler` is then replaced by
            `OracleScheduler.from_reference` at run time.
        reference: label of the combo whose outputs the oracle follows.
    """

    label: str
    config: DecodeConfig
    oracle: bool = False
    reference: str = "low_confidence"

    def but(self, suffix: str, **changes: Any) -> Combo:
        """This combo with `config` fields changed and `suffix` appended to its label."""
        return replace(self, label=f"{self.label}{suffix}", config=replace(self.config, **changes))


@dataclass(frozen=True)
class Decoded:
    """One decode: seconds inside model forwards, forward calls, the result."""

    forward_seconds: float
    forwards: int
    result: DecodeResult


@dataclass(frozen=True)
class Measured:
    """Every timed decode of one combo (`runs[repeat][chunk]`)."""

    combo: Combo
    runs: Runs[Decoded]

    def seconds(self) -> float:
        """Median over repeats of the wall-clock summed over chunks."""
        return self.runs.seconds()

    def overhead(self) -> float:
        """Median over repeats of the share of wall-clock spent outside model forward passes."""
        return statistics.median(
            1 - sum(t.value.forward_seconds for t in repeat) / max(sum(t.seconds for t in repeat), 1e-12)
            for repeat in self.runs.runs)

    def results(self) -> list[DecodeResult]:
        """Repeat 0's results, one per chunk (greedy decoding repeats exactly)."""
        return [d.result for d in self.runs.values()]

    def nfe(self) -> list[int]:
        """Forward passes per sample."""
        return [int(n) for result in self.results() for n in result.nfe.tolist()]

    def answer_tokens(self) -> list[int]:
        """Tokens before the first end-of-text, per sample."""
        return [int(n) for result in self.results() for n in result.answer_lengths.tolist()]

    def texts(self) -> list[str]:
        return [t for result in self.results() for t in (result.text or [""] * len(result.nfe))]

    def tokens(self) -> list[list[int]]:
        """The generated canvas per sample."""
        return [row for result in self.results() for row in result.tokens.tolist()]


def decode_once(model: Any, prompts: list, config: DecodeConfig, tokenizer: Any = None,
                trace: bool = False, sync: Callable[[], None] | None = None) -> Decoded:
    """One `generate` call with its forward passes timed (`sync`: see `forward_timer`)."""
    with forward_timer(model, sync) as spent:
        result = generate(model, prompts, config, tokenizer=tokenizer, trace=trace)
    return Decoded(spent[0], int(spent[1]), result)


def run_grid(model: Any, plans: Sequence[tuple[Combo, Sequence[Sequence[Sample]]]], repeats: int,
             tokenizer: Any = None, clock: Callable[[], float] = time.perf_counter) -> dict[str, Measured]:
    """Decode each plan's chunks under its combo `repeats` times, interleaved (`interleave`).

    Oracle combos follow the repeat-0 output of their reference combo on the same chunk index
    (decoded untimed first when the reference has not run there yet).

    Raises:
        ValueError: duplicate labels, or an oracle whose reference is missing, is itself an
            oracle, or decodes other chunks.
    """
    from dllm_decode.schedulers import OracleScheduler

    combos = {combo.label: combo for combo, _ in plans}
    chunks_of = {combo.label: chunks for combo, chunks in plans}
    for combo in combos.values():
        ref = combos.get(combo.reference)
        if combo.oracle and (ref is None or ref.oracle or chunks_of[ref.label] is not chunks_of[combo.label]):
            raise ValueError(f"oracle {combo.label!r} needs a reference combo {combo.reference!r} "
                             f"over the same chunks")
    references: dict[tuple[str, int], torch.Tensor] = {}

    def job(label: str, index: int, chunk: Sequence[Sample]) -> Callable[[], Decoded]:
        combo = combos[label]
        prompts = [s.prompt for s in chunk]
        config = combo.config
        if combo.oracle:
            key = (combo.reference, index)
            if key not in references:
                ref = combos[combo.reference].config
                references[key] = decode_once(model, prompts, ref, tokenizer).result.tokens
            config = replace(config, scheduler=OracleScheduler.from_reference(references[key]))

        def call() -> Decoded:
            decoded = decode_once(model, prompts, config, tokenizer)
            if not combo.oracle:
                references.setdefault((label, index), decoded.result.tokens)
            return decoded
        return call

    timed = interleave([(combo.label, chunks) for combo, chunks in plans], repeats, job, clock)
    return {label: Measured(combos[label], runs) for label, runs in timed.items()}


def chunked(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    return [list(samples[i:i + size]) for i in range(0, len(samples), size)]
