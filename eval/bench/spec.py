"""Speculative decoding benchmark: drafters and draft-length schedulers against plain AR greedy.

Two suites, each measured side by side in one run (`timing.interleave`):

* the embedded AR pair (`ar_target`, `ar_draft`, or other directories) on the task suite's test
  prompts in the AR models' chat template (`prompt =`): draft model, prompt lookup, layer
  skipping, and the diffusion model drafting whole blocks;
* SmolLM2-135M-Instruct (the fetched GGUF, float32) on a few chat prompts: prompt lookup and
  layer skipping (no smaller model shares its tokenizer here).

Per configuration: mean accepted tokens per target call (Spec-Bench's accept length, bonus
included), target and draft forwards per token, the per-token acceptance estimate alpha, the
theory (1 - alpha^(g+1)) / (1 - alpha) averaged over the rounds' draft lengths g (Leviathan et
al. 2023, arXiv 2211.17192, §3.1), the draft/target forward-time ratio c, the wall-time theory
(that expectation divided by 1 + g c', with c' = c x draft forwards per drafted token), the
measured wall-clock speedup vs plain AR greedy, and whether the output equals plain greedy token
for token (it must: greedy verification is exact). Batch size 1, greedy, float32.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dllm_decode.eval.bench.measure import Sample
from dllm_decode.eval.bench.sections import SuiteOptions
from dllm_decode.eval.bench.subject import Subject, scored
from dllm_decode.eval.bench.timing import Runs, check_counts, forward_timer, interleave, speedup
from dllm_decode.interfaces import Scheduler

if TYPE_CHECKING:
    from dllm_decode.speculative import Drafter, SpecResult

SMOLLM2_PROMPTS = (
    "Repeat the following sentence exactly, then translate it to French: The quick brown fox "
    "jumps over the lazy dog near the river bank.",
    "Fix the typos in this text and return it: 'Speculative decodng lets a smal model propose "
    "tokens that a large model verifes in one pass, so the output stays the same.'",
    "What is the capital of France? Answer in one sentence.",
)


@dataclass(frozen=True)
class SpecOptions:
    """One configuration of `bench spec`.

    Attributes:
        target, draft: the embedded suite's causal LMs (`load_causal_lm` names).
        dllm: the diffusion model drafting blocks (skipped when it is missing or its vocabulary
            differs).
        per_task: test prompts per task (all tasks).
        repeats: interleaved repeats of the embedded suite.
        max_new_tokens: generation budget per prompt.
        smollm2: also run the SmolLM2 suite (needs `dllm-decode fetch smollm2`).
        smollm2_repeats, smollm2_tokens: its repeats and budget.
        target_runtimes: the embedded suite runs once per target runtime (`hf`, `compact`).
    Raises:
        ValueError: a count below 1 or an unknown runtime.
    """

    target: str = "ar_target"
    draft: str = "ar_draft"
    dllm: str = "embedded"
    per_task: int = 2
    repeats: int = 3
    max_new_tokens: int = 48
    smollm2: bool = True
    smollm2_repeats: int = 1
    smollm2_tokens: int = 48
    target_runtimes: tuple[str, ...] = ("hf", "compact")

    def __post_init__(self) -> None:
        from dllm_decode.speculative import RUNTIMES

        check_counts(self, "per_task", "repeats", "max_new_tokens", "smollm2_repeats", "smollm2_tokens")
        if not self.target_runtimes or set(self.target_runtimes) - set(RUNTIMES):
            raise ValueError(f"target_runtimes must be some of {list(RUNTIMES)}, got {list(self.target_runtimes)}")


@dataclass(frozen=True)
class SpecCombo:
    """One row: a drafter (None: plain AR) and the scheduler that picks each draft length.

    `draft_model` is timed for the cost ratio c (None: the drafter runs no model)."""

    label: str
    drafter: Drafter | None
    scheduler: Scheduler
    max_draft: int = 8
    draft_model: Any = None


@dataclass(frozen=True)
class SpecRun:
    """One timed prompt: the result and the seconds and calls inside target and draft forwards."""

    result: SpecResult
    target_seconds: float
    target_calls: int
    draft_seconds: float
    draft_calls: int
    cpu_seconds: float = 0.0        # process CPU time: on a shared machine steadier than wall


def theory_tokens(alpha: float, drafted: Sequence[int]) -> float:
    """Mean over rounds of (1 - alpha^(g+1)) / (1 - alpha): expected tokens per target call."""
    if not drafted:
        return float("nan")
    if alpha >= 1.0:
        return statistics.fmean(g + 1 for g in drafted)
    return statistics.fmean((1 - alpha ** (g + 1)) / (1 - alpha) for g in drafted)


def theory_speedup(tokens_per_call: float, gamma: float, c: float) -> float:
    """Leviathan et al. 2023 §3.1: expected tokens per target call / (gamma c + 1), the wall-time
    gain when drafting a token costs c target steps and a verification costs one."""
    return tokens_per_call / (gamma * c + 1)


def measure(target: Any, prompts: Sequence[Any], combos: Sequence[SpecCombo], repeats: int,
            max_new_tokens: int, clock: Callable[[], float] = time.perf_counter) -> list[tuple[SpecCombo, Runs[SpecRun]]]:
    """Every combo on every prompt, `repeats` times, interleaved (`timing.interleave`)."""
    from dllm_decode.speculative import SpecConfig, speculative_generate

    by_label = {combo.label: combo for combo in combos}

    def job(label: str, index: int, prompt: Any) -> Callable[[], SpecRun]:
        combo = by_label[label]
        spec = SpecConfig(combo.scheduler, max_new_tokens=max_new_tokens, max_draft=combo.max_draft)

        def call() -> SpecRun:
            cpu_started = time.process_time()
            with forward_timer(target) as t, forward_timer(combo.draft_model) as d:
                result = speculative_generate(target, prompt, spec, combo.drafter)
            return SpecRun(result, t[0], int(t[1]), d[0], int(d[1]), time.process_time() - cpu_started)
        return call

    runs = interleave([(combo.label, list(prompts)) for combo in combos], repeats, job, clock)
    return [(combo, runs[combo.label]) for combo in combos]


def summarize(measured: Sequence[tuple[SpecCombo, Runs[SpecRun]]],
              scores: Callable[[list[Any]], Any] | None = None) -> list[dict[str, Any]]:
    """One entry per combo; the first combo is the baseline (plain AR) speedups are against."""
    base = measured[0][1]
    base_tokens = [r.result.tokens.tolist() for r in base.values()]
    every_base = [r for repeat in base.runs for r in (t.value for t in repeat)]
    t_target = sum(r.target_seconds for r in every_base) / max(1, sum(r.target_calls for r in every_base))
    out = []
    for combo, runs in measured:
        every = [t.value for repeat in runs.runs for t in repeat]
        results = [r.result for r in runs.values()]
        drafted = [d for r in results for d in r.drafted]
        matched = [m for r in results for m in r.matched]
        tokens = sum(len(r.tokens) for r in results)
        decisions = sum(m + (m < d) for m, d in zip(matched, drafted))
        alpha = sum(matched) / decisions if decisions else 0.0
        draft_calls = sum(r.draft_calls for r in every)
        c = (sum(r.draft_seconds for r in every) / draft_calls) / t_target if draft_calls else 0.0
        expected = theory_tokens(alpha, drafted) if decisions else 1.0
        same = [r.tokens.tolist() == b for r, b in zip(results, base_tokens)]
        entry = {
            "label": combo.label,
            "mean_accepted_tokens": statistics.fmean(a for r in results for a in r.appended),
            "theory_tokens_per_call": expected,
            "acceptance_rate": alpha,
            "mean_draft_length": statistics.fmean(drafted),
            "target_forwards_per_token": sum(r.target_forwards for r in results) / tokens,
            "draft_forwards_per_token": sum(r.draft_forwards for r in results) / tokens,
            "cost_ratio_c": c,
            # c per drafted token: a dLLM round costs its NFE, not one step per token.
            "theory_speedup": theory_speedup(
                expected, statistics.fmean(drafted),
                c * sum(r.draft_forwards for r in results) / max(1, sum(drafted))),
            "seconds": runs.seconds(),
            "seconds_per_repeat": runs.per_repeat(),
            "speedup": speedup(base, runs),
            "cpu_speedup": cpu_median(base) / cpu_median(runs),
            "exact": all(same),
            "same_output": 100 * sum(same) / len(same),
            "new_tokens": tokens,
        }
        if scores is not None:
            entry["accuracy"] = scores(results)
        out.append(entry)
    return out


def cpu_median(runs: Runs[SpecRun]) -> float:
    """Median over repeats of the process CPU seconds summed over prompts."""
    return statistics.median(sum(t.value.cpu_seconds for t in repeat) for repeat in runs.runs)


def tokens_per_call_by_task(tasks: Sequence[str], results: Sequence[Any]) -> dict[str, float]:
    """Per task (one name per result): new tokens / target forwards over its prompts."""
    tokens: dict[str, int] = {}
    calls: dict[str, int] = {}
    for task, result in zip(tasks, results):
        tokens[task] = tokens.get(task, 0) + len(result.tokens)
        calls[task] = calls.get(task, 0) + result.target_forwards
    return {task: tokens[task] / calls[task] for task in sorted(tokens)}


def ar_prompts(samples: Sequence[Sample], tokenizer: Any) -> list[Any]:
    """Each task sample's raw prompt in the AR tokenizer's chat template (`chat_prompt`; the
    embedded AR models' template appends their ` =` separator); random samples as token ids."""
    from dllm_decode.prompts import chat_prompt

    return [chat_prompt(tokenizer, s.example.prompt) if s.example is not None else s.prompt for s in samples]


def accuracy_of(tasks: dict | None, samples: Sequence[Sample]) -> Callable[[list[Any]], Any]:
    """Scores for `summarize`: the task accuracy (%) of the results' texts."""
    return lambda results: scored(tasks, samples, [r.text or "" for r in results])


def section_ar(subject: Subject, samples: Sequence[Sample], o: SuiteOptions) -> dict[str, Any]:
    """The suite's AR section: plain greedy AR vs AR + the shipped draft model (heuristic draft
    lengths, greedy verification), batch 1, on the suite's first `ar_samples` samples. The target
    runs in transformers; the draft in the compact runtime (the CLI's default for drafts)."""
    from dllm_decode.models import ModelLoadError
    from dllm_decode.speculative import HeuristicScheduler, ModelDrafter, with_runtime
    from dllm_decode.models.causal import load_causal_lm

    try:
        target, draft = load_causal_lm("ar_target"), load_causal_lm("ar_draft")
    except ModelLoadError as err:
        return {"skipped": str(err)}
    picked = list(samples[:o.ar_samples])
    draft = with_runtime(draft, "auto")
    combos = [SpecCombo("ar", None, HeuristicScheduler()),
              SpecCombo("ar+speculative", ModelDrafter(draft), HeuristicScheduler(), 8, draft)]
    measured = measure(target, ar_prompts(picked, target.tokenizer), combos, o.repeats, o.ar_new_tokens)
    return {"samples": len(picked), "max_new_tokens": o.ar_new_tokens,
            "rows": summarize(measured, accuracy_of(subject.tasks, picked))}


def embedded_suite(o: SpecOptions, log: Callable[[str], None]) -> dict[str, Any] | None:
    """The embedded AR pair, once per target runtime; None when the pair is not installed."""
    from dllm_decode.models import ModelLoadError
    from dllm_decode.models.causal import load_causal_lm

    try:
        loaded, draft_hf = load_causal_lm(o.target), load_causal_lm(o.draft)
    except ModelLoadError as err:
        log(f"embedded AR suite skipped: {err}")
        return None
    return {runtime: embedded_pair(o, loaded, draft_hf, runtime, log) for runtime in dict.fromkeys(o.target_runtimes)}


def embedded_pair(o: SpecOptions, loaded: Any, draft_hf: Any, runtime: str,
                  log: Callable[[str], None]) -> dict[str, Any]:
    """The embedded suite with the target run by `runtime` (plain AR in that runtime is the
    baseline); drafts run compact, plus one transformers-run draft row for comparison."""
    from dllm_decode.eval.bench.subject import task_samples
    from dllm_decode.eval.tasks import TASKS
    from dllm_decode.eval.tasks.tokenizer import SEPARATOR
    from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler
    from dllm_decode.speculative import (HeuristicScheduler, LookupDrafter, ModelDrafter,
                                         layerskip_drafter, with_runtime)

    target = with_runtime(loaded, runtime)
    draft = with_runtime(draft_hf, "auto")
    tokenizer = target.tokenizer
    samples = task_samples(TASKS, o.per_task)
    sep = tuple(tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"])
    constant = LowConfidenceScheduler(steps_per_block=1)
    layers = target.config.num_hidden_layers
    combos = [
        SpecCombo("plain AR greedy", None, constant),
        SpecCombo("draft model (hf), heuristic", ModelDrafter(draft_hf), HeuristicScheduler(), 16, draft_hf),
        SpecCombo("draft model, heuristic", ModelDrafter(draft), HeuristicScheduler(), 16, draft),
        SpecCombo("draft model, constant k=4", ModelDrafter(draft), constant, 4, draft),
        SpecCombo("draft model, threshold 0.4", ModelDrafter(draft), ThresholdScheduler(0.4), 8, draft),
        SpecCombo("prompt lookup, heuristic", LookupDrafter(), HeuristicScheduler(), 16),
    ]
    if layers > 1:
        half = layers // 2
        skip = layerskip_drafter(loaded, str(half), "auto")
        combos.append(SpecCombo(f"layer skip {half}/{layers}, thr 0.4", skip, ThresholdScheduler(0.4), 8,
                                skip.model))
    combos += dllm_drafter_combos(o.dllm, target.config.vocab_size, sep, log)
    log(f"embedded AR pair, target runtime {runtime}: {len(samples)} task prompts, {o.repeats} repeats")
    measured = measure(target, ar_prompts(samples, tokenizer), combos, o.repeats, o.max_new_tokens)
    entries = summarize(measured, accuracy_of(TASKS, samples))
    for entry, (_, runs) in zip(entries, measured):
        entry["tokens_per_call_by_task"] = tokens_per_call_by_task(
            [s.task for s in samples], [r.result for r in runs.values()])
    return {"target": o.target, "draft": o.draft, "target_runtime": runtime, "prompts": len(samples),
            "rows": entries}


def dllm_drafter_combos(name: str, vocab_size: int, drop_ids: tuple[int, ...],
                        log: Callable[[str], None]) -> list[SpecCombo]:
    """The diffusion model drafting a block: one denoising step drafts the whole block (every
    position clears a ~0 bar); the threshold rule spends more dLLM steps for better drafts.
    Lossless either way. None when the model is missing or speaks another vocabulary."""
    from dllm_decode.models import ModelLoadError
    from dllm_decode.modelspec import ModelSpec, load_diffusion
    from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler
    from dllm_decode.speculative import DiffusionDrafter

    try:
        dllm = load_diffusion(ModelSpec.parse(name))
        if dllm.vocab_size != vocab_size:
            raise ModelLoadError(f"vocabulary {dllm.vocab_size} != {vocab_size}")
        if getattr(dllm, "canvas_kind", "mask") != "mask":
            raise ModelLoadError(f"{name!r} is a uniform-noise model, not a masked one")
    except ModelLoadError as err:
        log(f"dLLM drafter skipped: {err}")
        return []
    constant = LowConfidenceScheduler(steps_per_block=1)
    return [SpecCombo(f"dLLM block k={k}, {label}", DiffusionDrafter(dllm, unmask, drop_ids=drop_ids),
                      constant, k, dllm)
            for label, unmask, k in (("1 step", ThresholdScheduler(1e-6), 8),
                                     ("1 step", ThresholdScheduler(1e-6), 16),
                                     ("threshold 0.7", ThresholdScheduler(0.7), 16))]


def smollm2_suite(o: SpecOptions, log: Callable[[str], None]) -> dict[str, Any] | None:
    """SmolLM2-135M-Instruct on chat prompts; None when it has not been fetched."""
    from dllm_decode.models import ModelLoadError
    from dllm_decode.prompts import chat_prompt
    from dllm_decode.schedulers import LowConfidenceScheduler
    from dllm_decode.speculative import HeuristicScheduler, LookupDrafter, layerskip_drafter
    from dllm_decode.models.causal import load_causal_lm

    try:
        model = load_causal_lm("smollm2")
    except ModelLoadError as err:
        log(f"SmolLM2 suite skipped: {err}")
        return None
    prompts = [chat_prompt(model.tokenizer, p) for p in SMOLLM2_PROMPTS]
    constant = LowConfidenceScheduler(steps_per_block=1)
    layers = model.config.num_hidden_layers
    combos = [
        SpecCombo("plain AR greedy", None, constant),
        SpecCombo("prompt lookup, heuristic", LookupDrafter(), HeuristicScheduler(), 16),
        SpecCombo("prompt lookup, constant k=4", LookupDrafter(), constant, 4),
    ]
    # Draft & Verify style: skip the middle fifth. Untrained early exit (the first half) agrees
    # with the full model on almost no token here; skipping the middle six of 30 layers on ~60%.
    middle = range(2 * layers // 5, 3 * layers // 5)
    skip = layerskip_drafter(model, ",".join(str(i) for i in range(layers) if i not in middle))
    combos.append(SpecCombo(f"layer skip middle {len(middle)}/{layers}, heuristic", skip,
                            HeuristicScheduler(), 8, skip.model))
    log(f"SmolLM2-135M-Instruct: {len(prompts)} chat prompts, {o.smollm2_repeats} repeats")
    measured = measure(model, prompts, combos, o.smollm2_repeats, o.smollm2_tokens)
    return {"prompts": list(SMOLLM2_PROMPTS), "rows": summarize(measured),
            "texts": [r.result.text for r in measured[0][1].values()]}


def run_spec(o: SpecOptions, log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Both suites; the JSON-ready report."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    report: dict[str, Any] = {"options": {**o.__dict__, "target_runtimes": list(o.target_runtimes)},
                              "embedded": embedded_suite(o, log)}
    if o.smollm2:
        report["smollm2"] = smollm2_suite(o, log)
    return report
