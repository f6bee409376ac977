"""Measurement core of `dllm-decode bench`: a forward timer and an interleaved runner.

Every configuration (a `Combo`) decodes the same chunks of samples; inside each repeat the
configurations run in a rotated order, chunk by chunk, so load drifts on a shared machine hit all
of them alike (design §5: compare in one run, report ratios of medians).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.interfaces import Cache, Filter, NoCache, Scheduler
from dllm_decode.sampler import generate


@contextlib.contextmanager
def forward_timer(model: Any) -> Iterator[list[float]]:
    """Time every forward pass of `model` while the context is open.

    Yields a list `[seconds inside forward, forward calls]` that fills as the model runs. The
    wrapper is an instance attribute (`nn.Module.__call__` looks `forward` up on the instance), so
    caches and the loop are timed without knowing about it; it is removed on exit.
    """
    spent = [0.0, 0]
    had_own = "forward" in vars(model)
    inner = model.forward

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started
            spent[1] += 1

    model.forward = timed
    try:
        yield spent
    finally:
        if had_own:
            model.forward = inner
        else:
            del model.forward


@dataclass(frozen=True)
class Sample:
    """One prompt of the benchmark: its task name and (for scored tasks) the example."""

    task: str
    prompt: str | list[int]
    example: Any = None


@dataclass(frozen=True)
class Combo:
    """One decoding configuration of the benchmark.

    Attributes:
        label: the row name in tables and JSON.
        scheduler: the policy; ignored when `oracle` is set.
        cache: None for a full forward every step.
        filters: applied after the scheduler, in order.
        oracle: decode with the Learn2PD oracle whose reference is the chunk's output under the
            `reference` combo (one token per step), as `dllm_decode.schedulers.oracle` prescribes.
        reference: label of the combo whose outputs the oracle follows.
    """

    label: str
    scheduler: Scheduler | None
    cache: Cache = field(default_factory=NoCache)
    filters: tuple[Filter, ...] = ()
    oracle: bool = False
    reference: str = "low_confidence"


@dataclass
class Measured:
    """Every run of one combo: per repeat, per chunk (seconds, forward seconds, forwards, result)."""

    combo: Combo
    runs: list[list[tuple[float, float, int, DecodeResult]]] = field(default_factory=list)

    def seconds(self) -> float:
        """Median over repeats of the wall-clock summed over chunks."""
        return statistics.median(sum(r[0] for r in repeat) for repeat in self.runs)

    def overhead(self) -> float:
        """Median over repeats of the share of wall-clock spent outside model forward passes."""
        return statistics.median(1 - sum(r[1] for r in rep) / max(sum(r[0] for r in rep), 1e-12)
                                 for rep in self.runs)

    def results(self) -> list[DecodeResult]:
        """Repeat 0's results, one per chunk (greedy decoding repeats exactly)."""
        return [r[3] for r in self.runs[0]]

    def nfe(self) -> list[int]:
        return [int(n) for result in self.results() for n in result.nfe.tolist()]

    def texts(self) -> list[str]:
        return [t for result in self.results() for t in (result.text or [""] * len(result.nfe))]


def decode_once(model: Any, prompts: list, combo: Combo, scheduler: Scheduler, gen: int, block: int,
                tokenizer: Any, trace: bool = False) -> tuple[float, float, int, DecodeResult]:
    """One timed `generate` call: (seconds, seconds inside forward, forwards, result)."""
    config = DecodeConfig(scheduler=scheduler, cache=combo.cache, filters=combo.filters,
                          gen_length=gen, block_length=block)
    generator = torch.Generator().manual_seed(0)
    with forward_timer(model) as spent:
        started = time.perf_counter()
        result = generate(model, prompts, config, generator=generator, tokenizer=tokenizer, trace=trace)
        seconds = time.perf_counter() - started
    return seconds, spent[0], int(spent[1]), result


def run_grid(model: Any, plans: Sequence[tuple[Combo, Sequence[Sequence[Sample]]]], gen: int,
             block: int, repeats: int, tokenizer: Any = None) -> dict[str, Measured]:
    """Decode each plan's chunks under its combo `repeats` times, interleaved.

    Repeat r visits chunk index 0 of every plan, then index 1, ..., with the plans in an order
    rotated by r. Oracle combos follow the repeat-0 output of their reference combo on the same
    chunk index (decoded untimed first when the reference has not run yet).
    """
    from dllm_decode.schedulers import OracleScheduler

    measured = {combo.label: Measured(combo) for combo, _ in plans}
    if len(measured) != len(plans):
        raise ValueError("combo labels must be unique")
    chunks_of = {combo.label: chunks for combo, chunks in plans}
    references: dict[tuple[str, int], torch.Tensor] = {}
    for repeat in range(repeats):
        order = list(plans[repeat % len(plans):]) + list(plans[:repeat % len(plans)])
        for m in measured.values():
            m.runs.append([])
        for index in range(max(len(chunks) for _, chunks in plans)):
            for combo, chunks in order:
                if index >= len(chunks):
                    continue
                prompts = [s.prompt for s in chunks[index]]
                scheduler = combo.scheduler
                if combo.oracle:
                    key = (combo.reference, index)
                    if key not in references:
                        ref = measured.get(combo.reference)
                        if ref is None or ref.combo.oracle or chunks_of[combo.reference] is not chunks:
                            raise ValueError(f"oracle {combo.label!r} needs a reference combo "
                                             f"{combo.reference!r} over the same chunks")
                        references[key] = decode_once(model, prompts, ref.combo, ref.combo.scheduler,
                                                      gen, block, tokenizer)[3].tokens
                    scheduler = OracleScheduler.from_reference(references[key])
                run = decode_once(model, prompts, combo, scheduler, gen, block, tokenizer)
                measured[combo.label].runs[-1].append(run)
                if repeat == 0 and not combo.oracle:
                    references.setdefault((combo.label, index), run[3].tokens)
    return measured


def chunked(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    return [list(samples[i:i + size]) for i in range(0, len(samples), size)]
