"""`bench scaling`: how time per sample grows with the generation length.

The same prompts decode at gen 64, 128, 256, ... up to the model's context (the longest canvas
that fits beside the longest prompt, in whole blocks), under the default decode (`threshold`, no
cache: what `dllm-decode` runs) and under one token per step (LLaDA's low-confidence rule), all in
one `run_grid`. Per configuration, the exponent k of seconds per sample ~ gen^k is fitted by least
squares on log-log axes, over all lengths and over the lengths from 256 up (where every forward
spanning the whole masked canvas shows).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dllm_decode.config import DecodeConfig
from dllm_decode.eval.bench.measure import Combo, chunked, run_grid
from dllm_decode.eval.bench.subject import Subject, samples_for
from dllm_decode.eval.bench.timing import check_counts

LONG_FROM = 256
"""Lengths from here up get their own fit: long canvases, where a cache's growth must stay sub-linear."""


@dataclass(frozen=True)
class ScalingOptions:
    """One configuration of `bench scaling`.

    Attributes:
        gen_lengths: the lengths; empty: 64, 128, 256, ... up to the context (`default_lengths`).
        block_length: semi-autoregressive block (divides every length).
        batch: prompts per `generate` call.
        per_task: test prompts per task, every task of the suite.
        repeats: interleaved repeats.
        caches: (label, cache) pairs; each adds the default decode under that cache.
    Raises:
        ValueError: a count below 1, or a length the block does not divide.
    """

    gen_lengths: tuple[int, ...] = ()
    block_length: int = 32
    batch: int = 8
    per_task: int = 1
    repeats: int = 3
    seed: int = 0
    caches: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        check_counts(self, "block_length", "batch", "per_task", "repeats")
        for gen in self.gen_lengths:
            self.configs(gen)

    def configs(self, gen: int) -> dict[str, DecodeConfig]:
        """The decodes compared, at one length."""
        from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler

        default = DecodeConfig(scheduler=ThresholdScheduler(), gen_length=gen, block_length=self.block_length)
        return {"default": default,
                "one token per step": replace(default, scheduler=LowConfidenceScheduler()),
                **{f"default, cache {label}": replace(default, cache=cache) for label, cache in self.caches}}


def default_lengths(room: int, block: int, start: int = 64) -> list[int]:
    """`start`, doubling while it fits in `room` tokens, then the longest whole-block length that
    fits (the context's end) when that is longer.

    Raises:
        ValueError: not even one block fits.
    """
    longest = room // block * block
    if longest < 1:
        raise ValueError(f"no canvas of whole {block}-token blocks fits in {room} tokens")
    lengths = []
    gen = max(start, block)
    while gen <= longest:
        lengths.append(gen)
        gen *= 2
    if not lengths or lengths[-1] < longest:
        lengths.append(longest)
    return lengths


def fit_exponent(lengths: Sequence[float], seconds: Sequence[float]) -> float:
    """Least-squares slope of log(seconds) against log(length): k in seconds ~ length^k.

    Raises:
        ValueError: fewer than two distinct lengths, or a value that is not positive.
    """
    if len(set(lengths)) < 2 or len(lengths) != len(seconds) or min(*lengths, *seconds) <= 0:
        raise ValueError(f"fit_exponent needs two or more distinct positive lengths and positive "
                         f"times, got {list(lengths)} and {list(seconds)}")
    x, y = [math.log(v) for v in lengths], [math.log(v) for v in seconds]
    mx, my = statistics.fmean(x), statistics.fmean(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def fits(lengths: Sequence[int], seconds: Sequence[float]) -> dict[str, float]:
    """Exponents over every length, and over the lengths from `LONG_FROM` up when two or more
    of them and not all; keyed by the range, e.g. `{"64-992": 0.9, "256-992": 1.2}`."""
    out = {f"{min(lengths)}-{max(lengths)}": fit_exponent(lengths, seconds)}
    long = [(g, s) for g, s in zip(lengths, seconds) if g >= LONG_FROM]
    if 2 <= len(long) < len(lengths):
        out[f"{long[0][0]}-{long[-1][0]}"] = fit_exponent(*zip(*long))
    return out


def lengths_for(subject: Subject, o: ScalingOptions) -> tuple[list[int], int, int]:
    """(the lengths to run, the longest prompt, the model's context).

    Raises:
        ValueError: a length that does not fit in the context beside the longest prompt.
    """
    from dllm_decode.prompts import encode_prompts

    samples = samples_for(subject, o.per_task, tasks=None, seed=o.seed)
    longest = max(len(ids) for ids in encode_prompts([s.prompt for s in samples], subject.tokenizer))
    context = getattr(subject.model, "max_length", None) or 1 << 30
    lengths = list(o.gen_lengths) or default_lengths(context - longest, o.block_length)
    if max(lengths) + longest > context:
        raise ValueError(f"gen length {max(lengths)} + the longest prompt ({longest} tokens) exceeds "
                         f"the model's context of {context}")
    return lengths, longest, context


def run_scaling(subject: Subject, o: ScalingOptions, say: Callable[[str], None] = lambda line: None,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """The length-scaling table and fits; the JSON-ready report.

    Raises:
        ValueError: as `lengths_for`.
    """
    samples = samples_for(subject, o.per_task, tasks=None, seed=o.seed)
    lengths, longest, context = lengths_for(subject, o)
    chunks = chunked(samples, o.batch)
    plans = [(Combo(f"{name} gen {gen}", config), chunks) for gen in lengths
             for name, config in o.configs(gen).items()]
    say(f"model: {subject.label}; {len(samples)} prompts; gen {', '.join(map(str, lengths))}; "
        f"{o.repeats} interleaved repeat(s)")
    measured = run_grid(subject.model, plans, o.repeats, subject.tokenizer, clock)
    rows, fitted = [], {}
    for name in o.configs(lengths[0]):
        per_sample = []
        for gen in lengths:
            m = measured[f"{name} gen {gen}"]
            seconds, answer = m.seconds(), m.answer_tokens()
            per_sample.append(seconds / len(samples))
            rows.append({"config": name, "gen": gen, "seconds_per_sample": per_sample[-1],
                         "nfe": statistics.fmean(m.nfe()), "answer_tokens": statistics.fmean(answer),
                         "answer_tokens_per_second": sum(answer) / seconds,
                         "tokens_per_second": gen * len(samples) / seconds})
        fitted[name] = fits(lengths, per_sample) if len(lengths) > 1 else {}
    return {"model": subject.label, "prompts": len(samples), "context": context, "longest_prompt": longest,
            "options": {"block_length": o.block_length, "batch": o.batch, "per_task": o.per_task,
                        "repeats": o.repeats},
            "configs": {name: c.to_dict() for name, c in o.configs(lengths[0]).items()},
            "lengths": lengths, "rows": rows, "exponents": fitted}
