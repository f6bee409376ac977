"""The diffusion sections of the benchmark suite: schedulers, stack, loop and oracle gap.

Counted the same way in every section: NFE (forward passes, refreshes included), tokens per step (canvas
length / NFE), answer tokens per step (tokens before the first end-of-text / NFE), accuracy (the
task's metric, in percent), seconds (median of interleaved repeats, `timing.interleave`),
overhead (share of wall-clock outside model forwards). Every speedup is a ratio of medians
measured in the same run.

* schedulers: every registered scheduler at its paper defaults and the tuned presets
  (`dllm_decode.eval.harness.presets`), without cache, against one token per step (LLaDA's
  low-confidence rule) and the Learn2PD oracle (arXiv 2509.25188);
* stack: prefix and dual caches (Fast-dLLM, arXiv 2505.22618) and the EoTP filter (Learn2PD) on
  `threshold` and on the best scheduler, and the full stack against one token per step;
* loop: overhead and tokens per second at several batch sizes;
* gap: how long tokens stay correct before one token per step commits them (`oracle_gap`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dllm_decode.config import DecodeConfig
from dllm_decode.eval.bench.measure import Combo, Measured, Sample, chunked, decode_once, run_grid
from dllm_decode.eval.bench.subject import Subject, scored
from dllm_decode.eval.bench.timing import check_counts
from dllm_decode.interfaces import Scheduler

BASELINE = "low_confidence"
"""One token per step without cache: the reference every speedup and accuracy delta is against."""
ACCURACY_SLACK = 1.0
"""Points of mean accuracy the best scheduler may lose against one token per step (the rule that
picks which scheduler the stack and loop sections build on)."""
SUFFIX_DUAL = "dual(suffix)"
"""Label of the dual cache that recomputes the whole prefix each step and caches only the suffix."""
WINDOW = "suffix window"
"""Label of the `suffix` cache (Streaming-dLLM's window over the masked suffix)."""


@dataclass(frozen=True)
class SuiteOptions:
    """One configuration of the suite (`bench all --quick` runs a seconds-long one).

    Attributes:
        gen_length, block_length: the canvas and the semi-autoregressive block.
        per_task: test examples per task.
        batch: prompts per `generate` call (schedulers, stack, gap).
        batch_sizes: the loop section's batch sizes.
        repeats: interleaved repeats (stack, loop, AR); `scheduler_repeats` for the scheduler table.
        ar_samples, ar_new_tokens: prompts and new tokens of the AR section.
        seed: of the task examples.
    Raises:
        ValueError: a count below 1, or a canvas the blocks do not tile.
    """

    gen_length: int = 256
    block_length: int = 32
    per_task: int = 8
    batch: int = 8
    batch_sizes: tuple[int, ...] = (1, 4, 16)
    repeats: int = 3
    scheduler_repeats: int = 1
    ar_samples: int = 14
    ar_new_tokens: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        from dllm_decode.schedulers import ThresholdScheduler

        check_counts(self, "gen_length", "block_length", "per_task", "batch", "repeats", "scheduler_repeats",
                     "ar_samples", "ar_new_tokens")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive, got {self.batch_sizes}")
        DecodeConfig(scheduler=ThresholdScheduler(), gen_length=self.gen_length, block_length=self.block_length)

    def config(self, scheduler: Scheduler, **fields: Any) -> DecodeConfig:
        """A decode record at this suite's lengths."""
        return DecodeConfig(scheduler=scheduler, gen_length=self.gen_length,
                            block_length=self.block_length, **fields)


def row(subject: Subject, samples: Sequence[Sample], m: Measured) -> dict[str, Any]:
    """The figures of one combo over the samples."""
    nfe, answer = m.nfe(), m.answer_tokens()
    gen = m.combo.config.gen_length
    seconds = m.seconds()
    return {"label": m.combo.label, "nfe": statistics.fmean(nfe),
            "tokens_per_step": statistics.fmean(gen / n for n in nfe),
            "answer_tokens_per_step": statistics.fmean(a / n for a, n in zip(answer, nfe)),
            "accuracy": scored(subject.tasks, samples, m.texts()), "seconds": seconds,
            "seconds_per_sample": seconds / len(samples),
            "answer_tokens_per_second": sum(answer) / seconds, "overhead": m.overhead()}


def relative(rows: list[dict[str, Any]], base: str, suffix: str) -> None:
    """Add `nfe_vs_<suffix>`, `speedup_vs_<suffix>` and, with accuracy, `accuracy_delta_vs_<suffix>`
    and `worst_task_delta_vs_<suffix>` to each row."""
    ref = next(r for r in rows if r["label"] == base)
    for r in rows:
        r[f"nfe_vs_{suffix}"] = r["nfe"] / ref["nfe"]
        r[f"speedup_vs_{suffix}"] = ref["seconds"] / r["seconds"]
        if r["accuracy"] is not None:
            r[f"accuracy_delta_vs_{suffix}"] = r["accuracy"]["mean"] - ref["accuracy"]["mean"]
            r[f"worst_task_delta_vs_{suffix}"] = min(r["accuracy"][t] - ref["accuracy"][t]
                                                     for t in r["accuracy"] if t != "mean")


def scheduler_combos(options: SuiteOptions, tokenizer: Any) -> list[Combo]:
    """One token per step, every other registered scheduler at its defaults, the tuned presets
    (`preset:NAME`), and the oracle following one token per step."""
    from dllm_decode.eval.harness.presets import PRESETS
    from dllm_decode.schedulers import MASK_SCHEDULERS as SCHEDULERS  # the suite's models are masked
    from dllm_decode.schedulers import with_delimiters

    def delimited(config: DecodeConfig) -> DecodeConfig:
        return replace(config, scheduler=with_delimiters(config.scheduler, tokenizer))

    baseline = Combo(BASELINE, options.config(SCHEDULERS[BASELINE]()))
    combos = [baseline]
    combos += [Combo(name, delimited(options.config(cls()))) for name, cls in sorted(SCHEDULERS.items())
               if name not in (BASELINE, "oracle")]
    combos += [Combo(f"preset:{name}", delimited(preset.config(gen_length=options.gen_length,
                                                               block_length=options.block_length)))
               for name, preset in PRESETS.items()]
    return combos + [Combo("oracle", baseline.config, oracle=True, reference=BASELINE)]


def best_of(rows: list[dict[str, Any]], stackable: set[str] | None = None) -> str:
    """The fewest-NFE non-oracle row whose mean accuracy is within `ACCURACY_SLACK` of one token
    per step (any row when accuracy is unknown), among the `stackable` labels when given (rules
    the stack's block caches can follow)."""
    ok = [r for r in rows if r["label"] != "oracle" and
          (stackable is None or r["label"] in stackable) and
          (r["accuracy"] is None or r["accuracy_delta_vs_baseline"] >= -ACCURACY_SLACK)]
    return min(ok, key=lambda r: (r["nfe"], -r["speedup_vs_baseline"]))["label"]


def combo_named(label: str, options: SuiteOptions, tokenizer: Any) -> Combo:
    """The scheduler-table combo called `label` (a scheduler name or `preset:NAME`).

    Raises:
        ValueError: no such row (the message lists them).
    """
    combos = {c.label: c for c in scheduler_combos(options, tokenizer) if not c.oracle}
    if label not in combos:
        raise ValueError(f"unknown scheduler-table row {label!r}; choose from {sorted(combos)}")
    return combos[label]


def section_schedulers(subject: Subject, samples: list[Sample], o: SuiteOptions) -> dict[str, Any]:
    combos = scheduler_combos(o, subject.tokenizer)
    chunks = chunked(samples, o.batch)
    measured = run_grid(subject.model, [(c, chunks) for c in combos], o.scheduler_repeats, subject.tokenizer)
    rows = [row(subject, samples, m) for m in measured.values()]
    relative(rows, BASELINE, "baseline")
    relative(rows, "oracle", "oracle")
    # a rule that takes back tokens of earlier blocks cannot run under the stack's caches
    stackable = {c.label for c in combos if c.config.scheduler.revises != "generated"}
    return {"rows": rows, "best": best_of(rows, stackable), "repeats": o.scheduler_repeats}


def stack_combos(best: Combo, options: SuiteOptions) -> list[Combo]:
    """One token per step without cache, then for `threshold` (Fast-dLLM's default) and the best
    configuration: no cache, prefix, dual, + EoTP, dual + EoTP (the full stack), dual refreshed
    every 2 steps + EoTP, the suffix-only dual cache + EoTP (`prefix_look` over the whole
    prefix, dInfer's vicinity refresh: short prompts make the prefix cheap to recompute, and its
    stale K/V is what costs a small model accuracy under the plain dual cache), and Streaming-dLLM's
    window over the masked suffix + EoTP (no forward spans the far canvas). A configuration
    whose filters already hold an EoTP filter keeps it instead of adding a second one."""
    from dllm_decode.caches import DualCache, PrefixCache, SuffixCache
    from dllm_decode.filters import EoTPFilter
    from dllm_decode.interfaces import NoCache
    from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler

    out = [Combo(BASELINE, options.config(LowConfidenceScheduler()))]
    for base in (Combo("threshold", options.config(ThresholdScheduler())), best):
        if any(c.label == base.label for c in out):
            continue
        filters = base.config.filters
        eotp = filters if any(isinstance(f, EoTPFilter) for f in filters) else filters + (EoTPFilter(),)
        out += [base.but("", cache=NoCache()), base.but("+prefix", cache=PrefixCache()),
                base.but("+dual", cache=DualCache()),
                base.but("+eotp", cache=NoCache(), filters=eotp),
                base.but("+dual+eotp", cache=DualCache(), filters=eotp),
                base.but("+dual(refresh 2)+eotp", cache=DualCache(refresh_every=2), filters=eotp),
                base.but(f"+{SUFFIX_DUAL}+eotp", cache=DualCache(prefix_look=1 << 20), filters=eotp),
                base.but(f"+{WINDOW}+eotp", cache=SuffixCache(), filters=eotp)]
    return out


def full_stack(best: Combo, options: SuiteOptions) -> Combo:
    """The best scheduler with the suffix-only dual cache and EoTP (the loop section's stack)."""
    label = f"{best.label}+{SUFFIX_DUAL}+eotp"
    return next(c for c in stack_combos(best, options) if c.label == label)


def section_stack(subject: Subject, samples: list[Sample], o: SuiteOptions, best: Combo) -> dict[str, Any]:
    combos = stack_combos(best, o)
    chunks = chunked(samples, o.batch)
    measured = run_grid(subject.model, [(c, chunks) for c in combos], o.repeats, subject.tokenizer)
    rows = [row(subject, samples, m) for m in measured.values()]
    relative(rows, BASELINE, "baseline")
    seconds = {label: m.seconds() for label, m in measured.items()}
    speedups = {}
    for name in dict.fromkeys(["threshold", best.label]):
        if name == BASELINE:
            continue
        speedups[name] = {
            "prefix_cache": seconds[name] / seconds[f"{name}+prefix"],
            "dual_cache": seconds[name] / seconds[f"{name}+dual"],
            "eotp_filter": seconds[name] / seconds[f"{name}+eotp"],
            "eotp_on_dual": seconds[f"{name}+dual"] / seconds[f"{name}+dual+eotp"],
            "full_stack_vs_baseline": seconds[BASELINE] / seconds[f"{name}+dual+eotp"],
            "suffix_stack_vs_baseline": seconds[BASELINE] / seconds[f"{name}+{SUFFIX_DUAL}+eotp"],
            "window_stack_vs_baseline": seconds[BASELINE] / seconds[f"{name}+{WINDOW}+eotp"],
        }
    return {"rows": rows, "speedups": speedups, "best": best.label,
            "full_stacks": [f"{best.label}+dual+eotp", f"{best.label}+{SUFFIX_DUAL}+eotp",
                            f"{best.label}+{WINDOW}+eotp"]}


def section_loop(subject: Subject, samples: list[Sample], o: SuiteOptions, stack: Combo) -> dict[str, Any]:
    """Overhead and tokens/s at each batch size: the same prompts, cut into batches of b."""
    from dllm_decode.schedulers import LowConfidenceScheduler

    prompts = samples[:max(o.batch_sizes)]
    combos = [Combo(BASELINE, o.config(LowConfidenceScheduler())), stack]
    plans = [(Combo(f"{c.label}@B{b}", c.config), chunked(prompts, b)) for c in combos for b in o.batch_sizes]
    measured = run_grid(subject.model, plans, o.repeats, subject.tokenizer)
    rows = []
    for combo in combos:
        first = None
        for b in o.batch_sizes:
            m = measured[f"{combo.label}@B{b}"]
            tps = o.gen_length * len(prompts) / m.seconds()
            first = first or tps
            rows.append({"config": combo.label, "batch": b, "seconds": m.seconds(),
                         "tokens_per_second": tps, "vs_batch_1": tps / first,
                         "answer_tokens_per_second": sum(m.answer_tokens()) / m.seconds(),
                         "overhead": m.overhead(), "nfe": statistics.fmean(m.nfe())})
    return {"prompts": len(prompts), "rows": rows}


def section_gap(subject: Subject, samples: list[Sample], o: SuiteOptions) -> dict[str, Any]:
    """Trace one token per step on the samples; summarize how long tokens wait (`oracle_gap`)."""
    from dllm_decode.eval.bench.oracle_gap import add_chunk, summarize
    from dllm_decode.schedulers import LowConfidenceScheduler

    groups: dict[str, dict[str, list]] = {}
    config = o.config(LowConfidenceScheduler())
    for chunk in chunked(samples, o.batch):
        result = decode_once(subject.model, [s.prompt for s in chunk], config, subject.tokenizer,
                             trace=True).result
        add_chunk(groups, result, [s.task for s in chunk], subject.model.eos_token_ids)
    return summarize(groups)
