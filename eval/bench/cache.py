"""`bench cache`: the block KV caches side by side over many prompts and batch sizes.

Setting (Fast-dLLM's published LLaDA runs, arXiv 2505.22618 §4): block 32, the `threshold`
scheduler at 0.9, greedy. Every cell (generation length x batch size) decodes the same prompts
(by default the task suite's test prompts, 4 per task: 48) under `none`, `prefix`, `dual`, the
adaptive and suffix-pruning caches (`d2`, `elastic`, `suffix`, `suffix:mode=dpad`) and any configured
variant, in one `run_grid` (interleaved repeats; medians; speedups are ratios of
medians within a cell). Throughput is reported twice: answer tokens per second (tokens before the
first end-of-text, what a reader receives) and canvas tokens per second (gen length x prompts,
EOS filler included). Accuracy and agreement with `none` come from the same decodes. Beside each
cell, the cost of one forward at the first block (full, prefix-cached, dual-cached): the ceiling
any mix of steps can reach.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dllm_decode.config import DecodeConfig
from dllm_decode.eval.bench.forward import forward_costs
from dllm_decode.eval.bench.measure import Combo, chunked, run_grid
from dllm_decode.eval.bench.subject import Subject, samples_for, scored
from dllm_decode.eval.bench.timing import check_counts
from dllm_decode.interfaces import Cache
from dllm_decode.registry import component_dict

CACHE_NAMES = ("none", "prefix", "dual")
"""Compared in every run (`none` is the reference, `dual` the one `vs_dual` divides by);
`CacheOptions.variants` adds configured ones."""

NEW_CACHES = ("d2", "elastic", "suffix", "suffix:mode=dpad")
"""The adaptive and suffix-pruning caches, compared by default (`new_caches=False` leaves them out;
a variant with the same label replaces one)."""


@dataclass(frozen=True)
class CacheOptions:
    """One configuration of `bench cache`.

    Attributes:
        gen_lengths, batch_sizes: the cells.
        per_task: test prompts per task, every task of the suite (random prompts without one).
        repeats: interleaved repeats; `forward_repeats` for the one-forward costs.
        block_length, threshold: the decode (Fast-dLLM's defaults).
        stop_at_eos: stop a row after the block holding its end-of-text (the loop's default);
            off, every decode spans the whole canvas (a long decode).
        variants: extra (label, cache) rows, e.g. ("dual:prefix_look=1024", DualCache(...)).
        new_caches: also compare `NEW_CACHES` at their defaults.
    Raises:
        ValueError: a count below 1, a gen length the block does not divide, a threshold outside
            (0, 1], a variant label that repeats a cache name.
    """

    gen_lengths: tuple[int, ...] = (256, 512)
    batch_sizes: tuple[int, ...] = (1, 4, 16)
    per_task: int = 4
    repeats: int = 3
    forward_repeats: int = 5
    block_length: int = 32
    threshold: float = 0.9
    stop_at_eos: bool = True
    variants: tuple[tuple[str, Cache], ...] = ()
    new_caches: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        from dllm_decode.schedulers import ThresholdScheduler

        check_counts(self, "per_task", "repeats", "forward_repeats")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch sizes must be positive, got {list(self.batch_sizes)}")
        if not self.gen_lengths:
            raise ValueError("give at least one gen length")
        for gen in self.gen_lengths:
            DecodeConfig(scheduler=ThresholdScheduler(self.threshold), gen_length=gen,
                         block_length=self.block_length)
        labels = [*CACHE_NAMES, *(label for label, _ in self.variants)]    # may replace a NEW_CACHES one
        if len(set(labels)) != len(labels):
            raise ValueError(f"cache labels must be unique, got {labels}")

    def caches(self) -> dict[str, Cache]:
        from dllm_decode.registry import component

        defaults = {name: _spec(name) for name in CACHE_NAMES + (NEW_CACHES if self.new_caches else ())}
        named = {label: component("cache", spec) for label, spec in defaults.items()}
        return {**named, **dict(self.variants)}

    def config(self, gen: int, cache: Cache) -> DecodeConfig:
        from dllm_decode.schedulers import ThresholdScheduler

        return DecodeConfig(scheduler=ThresholdScheduler(self.threshold), cache=cache, gen_length=gen,
                            block_length=self.block_length, stop_at_eos=self.stop_at_eos)


def _spec(label: str) -> dict[str, str]:
    """`name:key=value,...` as a component mapping."""
    name, _, rest = label.partition(":")
    return {"name": name, **dict(item.split("=", 1) for item in rest.split(",") if item)}


def label_of(gen: int, batch: int, cache: str) -> str:
    return f"gen {gen} B{batch} {cache}"


def run_cache(subject: Subject, o: CacheOptions, say: Callable[[str], None] = lambda line: None,
              clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """The cache benchmark; the JSON-ready report (`rows`: one per cell and cache)."""
    samples = samples_for(subject, o.per_task, tasks=None, seed=o.seed)
    caches = o.caches()
    plans = [(Combo(label_of(gen, b, name), o.config(gen, cache)), chunked(samples, b))
             for gen in o.gen_lengths for b in o.batch_sizes for name, cache in caches.items()]
    say(f"model: {subject.label}; {len(samples)} prompts; {len(plans)} configurations, "
        f"{o.repeats} interleaved repeat(s)")
    costs = [{"gen": gen, "batch": b, **forward_costs(subject.model, [s.prompt for s in samples[:b]],
                                                      subject.tokenizer, gen, o.block_length, o.forward_repeats)}
             for gen in o.gen_lengths for b in o.batch_sizes]
    measured = run_grid(subject.model, plans, o.repeats, subject.tokenizer, clock)
    rows = []
    for gen in o.gen_lengths:
        for b in o.batch_sizes:
            none = measured[label_of(gen, b, "none")]
            dual = measured[label_of(gen, b, "dual")]
            for name in caches:
                m = measured[label_of(gen, b, name)]
                seconds, answer = m.seconds(), m.answer_tokens()
                same = [a == z for a, z in zip(m.tokens(), none.tokens())]
                rows.append({"gen": gen, "batch": b, "cache": name,
                             "seconds_per_sample": seconds / len(samples),
                             "answer_tokens_per_second": sum(answer) / seconds,
                             "tokens_per_second": gen * len(samples) / seconds,
                             "answer_tokens": statistics.fmean(answer),
                             "nfe": statistics.fmean(m.nfe()), "speedup": none.seconds() / seconds,
                             "vs_dual": dual.seconds() / seconds,
                             "same_tokens_as_none": 100 * sum(same) / len(same),
                             "accuracy": scored(subject.tasks, samples, m.texts())})
    return {"model": subject.label, "prompts": len(samples),
            "tasks": sorted({s.task for s in samples}),
            "options": {"gen_lengths": list(o.gen_lengths), "batch_sizes": list(o.batch_sizes),
                        "per_task": o.per_task, "repeats": o.repeats, "block_length": o.block_length,
                        "threshold": o.threshold, "stop_at_eos": o.stop_at_eos, "new_caches": o.new_caches,
                        "caches": {name: component_dict(cache) for name, cache in caches.items()}},
            "forward_ms": costs, "rows": rows}
