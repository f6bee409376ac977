"""Speculative decoding benchmark: every drafter and draft-length scheduler against plain AR greedy.

    python -m dllm_decode.eval.bench.spec [--json FILE] [--per-task N] [--repeats R] [--no-smollm2]

Two suites, each measured side by side in one run (the configurations of a suite decode the
same prompts in a rotated order within every repeat, so load drifts on a shared machine hit all
of them alike; design §5: report ratios of medians):

* the embedded AR pair (`ar_target`, `ar_draft`; or `--target/--draft` directories) on the task
  suite's test prompts (`prompt =`, the AR training format): draft model, prompt lookup, layer
  skipping, and the embedded dLLM drafting whole blocks;
* SmolLM2-135M-Instruct (the fetched GGUF, float32) on a few chat prompts: prompt lookup and
  layer skipping (no smaller model shares its tokenizer here).

Per configuration: mean accepted tokens per target call (Spec-Bench's accept length, bonus
included), target and draft forwards per token, the per-token acceptance estimate alpha, the
theory (1 - alpha^(g+1)) / (1 - alpha) averaged over the rounds' draft lengths g (Leviathan et al.
2023 §3.1), the draft/target forward-time ratio c, the wall-time theory (that expectation
divided by 1 + g c', with c' = c x draft forwards per drafted token), the
measured wall-clock speedup vs plain AR greedy, and
whether the output equals plain greedy token for token (it must: greedy verification is exact).
Batch size 1, greedy, float32, CPU, `--threads` torch threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dllm_decode.interfaces import Scheduler
from dllm_decode.models import ModelLoadError, load_model
from dllm_decode.speculative import (RUNTIMES, DiffusionDrafter, Drafter,
                                     HeuristicScheduler, LookupDrafter, ModelDrafter, SpecConfig,
                                     SpecResult, layerskip_drafter, speculative_generate,
                                     with_runtime)
from dllm_decode.speculative.models import load_causal_lm
from dllm_decode.eval.bench.measure import forward_timer
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler

SMOLLM2_PROMPTS = (
    "Repeat the following sentence exactly, then translate it to French: The quick brown fox "
    "jumps over the lazy dog near the river bank.",
    "Fix the typos in this text and return it: 'Speculative decodng lets a smal model propose "
    "tokens that a large model verifes in one pass, so the output stays the same.'",
    "What is the capital of France? Answer in one sentence.",
)


@dataclass(frozen=True)
class Config:
    """One row: a drafter (None: plain AR) and the scheduler that picks each draft length."""

    label: str
    drafter: Drafter | None
    scheduler: Scheduler
    max_draft: int = 8
    draft_model: Any = None          # timed for the cost ratio c (None: no model forwards)


@dataclass
class Row:
    config: Config
    seconds: list[float] = field(default_factory=list)      # per repeat, summed over prompts
    cpu_seconds: list[float] = field(default_factory=list)  # the same in process CPU time
    results: list[SpecResult] = field(default_factory=list)  # repeat 0, one per prompt
    target_time: float = 0.0                                 # seconds inside target forwards
    target_calls: int = 0
    draft_time: float = 0.0
    draft_calls: int = 0


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


def measure(target: Any, prompts: Sequence[list[int]], configs: Sequence[Config], repeats: int,
            max_new_tokens: int, log: Callable[[str], None]) -> list[Row]:
    rows = [Row(c) for c in configs]
    for repeat in range(repeats):
        totals = [0.0] * len(rows)
        cpu = [0.0] * len(rows)
        for i, prompt in enumerate(prompts):
            shift = (repeat * len(prompts) + i) % len(rows)
            for j in [(k + shift) % len(rows) for k in range(len(rows))]:   # rotated order
                row = rows[j]
                spec = SpecConfig(row.config.scheduler, max_new_tokens=max_new_tokens,
                                  max_draft=row.config.max_draft)
                with forward_timer(target) as t_spent, _maybe_timer(row.config.draft_model) as d_spent:
                    started, cpu_started = time.perf_counter(), time.process_time()
                    result = speculative_generate(target, prompt, spec, row.config.drafter)
                    totals[j] += time.perf_counter() - started
                    cpu[j] += time.process_time() - cpu_started
                row.target_time += t_spent[0]
                row.target_calls += t_spent[1]
                row.draft_time += d_spent[0]
                row.draft_calls += d_spent[1]
                if repeat == 0:
                    row.results.append(result)
        for row, total, spent in zip(rows, totals, cpu):
            row.seconds.append(total)
            row.cpu_seconds.append(spent)
        log(f"  repeat {repeat + 1}/{repeats}: " + ", ".join(
            f"{r.config.label} {s:.1f}s" for r, s in zip(rows, totals)))
    return rows


class _NoTimer:
    def __enter__(self) -> list[float]:
        return [0.0, 0]

    def __exit__(self, *exc: Any) -> None:
        return None


def _maybe_timer(model: Any):
    return forward_timer(model) if model is not None else _NoTimer()


def summarize(rows: list[Row], scores: Callable[[list[SpecResult]], float] | None = None) -> list[dict]:
    baseline = rows[0]
    base_seconds = statistics.median(baseline.seconds)
    base_tokens = [r.tokens.tolist() for r in baseline.results]
    t_target = baseline.target_time / max(1, baseline.target_calls)   # one-token target step
    out = []
    for row in rows:
        results = row.results
        appended = [a for r in results for a in r.appended]
        drafted = [d for r in results for d in r.drafted]
        matched = [m for r in results for m in r.matched]
        tokens = sum(len(r.tokens) for r in results)
        decisions = sum(m + (m < d) for m, d in zip(matched, drafted))
        alpha = sum(matched) / decisions if decisions else 0.0
        t_draft = row.draft_time / max(1, row.draft_calls)
        expected = theory_tokens(alpha, drafted) if decisions else 1.0
        entry = {
            "label": row.config.label,
            "mean_accepted_tokens": statistics.fmean(appended),
            "theory_tokens_per_call": expected,
            "acceptance_rate": alpha,
            "mean_draft_length": statistics.fmean(drafted),
            "target_forwards_per_token": sum(r.target_forwards for r in results) / tokens,
            "draft_forwards_per_token": sum(r.draft_forwards for r in results) / tokens,
            "cost_ratio_c": t_draft / t_target if row.draft_calls else 0.0,
            # c per drafted token: a dLLM round costs its NFE, not one step per token.
            "theory_speedup": theory_speedup(
                expected, statistics.fmean(drafted),
                (t_draft / t_target) * sum(r.draft_forwards for r in results) / max(1, sum(drafted))
                if row.draft_calls else 0.0),
            "seconds": statistics.median(row.seconds),
            "seconds_per_repeat": row.seconds,
            "speedup": base_seconds / statistics.median(row.seconds),
            # CPU time of the process: on a loaded shared machine a steadier proxy of wall-clock.
            "cpu_speedup": statistics.median(baseline.cpu_seconds) / statistics.median(row.cpu_seconds),
            "exact": [r.tokens.tolist() for r in results] == base_tokens,
            "new_tokens": tokens,
        }
        if scores is not None:
            entry["accuracy"] = scores(results)
        out.append(entry)
    return out


def tokens_per_call_by_task(tasks: Sequence[str], results: Sequence[SpecResult]) -> dict[str, float]:
    """Per task (one name per result): new tokens / target forwards over its prompts."""
    tokens: dict[str, int] = {}
    calls: dict[str, int] = {}
    for task, result in zip(tasks, results):
        tokens[task] = tokens.get(task, 0) + len(result.tokens)
        calls[task] = calls.get(task, 0) + result.target_forwards
    return {task: tokens[task] / calls[task] for task in sorted(tokens)}


def print_table(title: str, entries: list[dict], log: Callable[[str], None]) -> None:
    log(f"\n{title}")
    head = (f"{'configuration':<34} {'acc/call':>8} {'E[tok]':>7} {'alpha':>6} {'g':>5} "
            f"{'T fwd/tok':>9} {'D fwd/tok':>9} {'c':>5} {'E[spd]':>7} {'speedup':>7} {'exact':>5}")
    log(head)
    log("-" * len(head))
    for e in entries:
        log(f"{e['label']:<34} {e['mean_accepted_tokens']:>8.2f} {e['theory_tokens_per_call']:>7.2f} "
            f"{e['acceptance_rate']:>6.2f} {e['mean_draft_length']:>5.2f} "
            f"{e['target_forwards_per_token']:>9.3f} {e['draft_forwards_per_token']:>9.3f} "
            f"{e['cost_ratio_c']:>5.2f} {e['theory_speedup']:>6.2f}x {e['speedup']:>6.2f}x {str(e['exact']):>5}"
            + (f"  acc {e['accuracy']:.0%}" if "accuracy" in e else ""))


def embedded_suite(args: argparse.Namespace, log: Callable[[str], None]) -> dict | None:
    try:
        loaded = load_causal_lm(args.target)
        draft_hf = load_causal_lm(args.draft)
    except ModelLoadError as err:
        log(f"embedded AR suite skipped: {err}")
        return None
    return {runtime: embedded_pair(args, loaded, draft_hf, runtime, log)
            for runtime in dict.fromkeys(args.target_runtime)}


def embedded_pair(args: argparse.Namespace, loaded: Any, draft_hf: Any, runtime: str,
                  log: Callable[[str], None]) -> dict:
    """The embedded suite with the target run by `runtime` (plain AR in that runtime is the
    baseline); drafts run compact, plus one transformers-run draft row for comparison."""
    from dllm_decode.eval.tasks import TASKS
    from dllm_decode.eval.tasks.tokenizer import SEPARATOR

    target = with_runtime(loaded, runtime)
    draft = with_runtime(draft_hf, "auto")
    tokenizer = target.tokenizer
    examples = [e for name in sorted(TASKS) for e in TASKS[name].examples("test", args.per_task, 0)]
    prompts = [tokenizer(f"{e.prompt} {SEPARATOR}", add_special_tokens=False)["input_ids"]
               for e in examples]
    sep = tuple(tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"])
    constant = LowConfidenceScheduler(steps_per_block=1)
    half = max(1, target.config.num_hidden_layers // 2)
    configs = [
        Config("plain AR greedy", None, constant),
        Config("draft model (hf), heuristic", ModelDrafter(draft_hf), HeuristicScheduler(), 16, draft_hf),
        Config("draft model, heuristic", ModelDrafter(draft), HeuristicScheduler(), 16, draft),
        Config("draft model, constant k=4", ModelDrafter(draft), constant, 4, draft),
        Config("draft model, threshold 0.4", ModelDrafter(draft), ThresholdScheduler(0.4), 8, draft),
        Config("prompt lookup, heuristic", LookupDrafter(), HeuristicScheduler(), 16),
    ]
    if target.config.num_hidden_layers > 1:
        skip = layerskip_drafter(loaded, str(half), "auto")
        configs.append(Config(f"layer skip {half}/{target.config.num_hidden_layers}, thr 0.4", skip,
                              ThresholdScheduler(0.4), 8, skip.model))
    try:
        dllm = load_model(args.dllm)
        if dllm.vocab_size != target.config.vocab_size:
            raise ModelLoadError(f"vocabulary {dllm.vocab_size} != {target.config.vocab_size}")
        # One denoising step drafts the whole block (every position clears a ~0 bar); the
        # threshold rule spends more dLLM steps for better drafts. Lossless either way.
        for label, unmask, k in (("1 step", ThresholdScheduler(1e-6), 8),
                                 ("1 step", ThresholdScheduler(1e-6), 16),
                                 ("threshold 0.7", ThresholdScheduler(0.7), 16)):
            configs.append(Config(f"dLLM block k={k}, {label}", DiffusionDrafter(
                dllm, unmask, drop_ids=sep), constant, k, dllm))
    except ModelLoadError as err:
        log(f"dLLM drafter skipped: {err}")
    log(f"embedded AR pair, target runtime {runtime}: {len(prompts)} task prompts, {args.repeats} repeats")
    rows = measure(target, prompts, configs, args.repeats, args.max_new_tokens, log)

    def accuracy(results: list[SpecResult]) -> float:
        return statistics.fmean(TASKS[e.task].score(e, r.text or "") for e, r in zip(examples, results))

    entries = summarize(rows, accuracy)
    by_task = {row.config.label: tokens_per_call_by_task([e.task for e in examples], row.results)
               for row in rows}
    for entry in entries:
        entry["tokens_per_call_by_task"] = by_task[entry["label"]]
    print_table(f"embedded AR pair ({args.target} / {args.draft}), target runtime {runtime}, "
                f"{len(prompts)} task prompts", entries, log)
    log("\ntokens per target call by task: " + ", ".join(
        f"{task} {value:.2f}" for task, value in by_task["draft model, heuristic"].items())
        + " (draft model, heuristic)")
    return {"target": args.target, "draft": args.draft, "target_runtime": runtime,
            "prompts": len(prompts), "rows": entries}


def smollm2_suite(args: argparse.Namespace, log: Callable[[str], None]) -> dict | None:
    try:
        model = load_causal_lm("smollm2")
    except ModelLoadError as err:
        log(f"SmolLM2 suite skipped: {err}")
        return None
    tokenizer = model.tokenizer
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
               for p in SMOLLM2_PROMPTS]
    constant = LowConfidenceScheduler(steps_per_block=1)
    layers = model.config.num_hidden_layers
    configs = [
        Config("plain AR greedy", None, constant),
        Config("prompt lookup, heuristic", LookupDrafter(), HeuristicScheduler(), 16),
        Config("prompt lookup, constant k=4", LookupDrafter(), constant, 4),
    ]
    # Draft & Verify style: skip the middle fifth. Untrained early exit (the first half) agrees
    # with the full model on almost no token here; skipping the middle six of 30 layers on ~60%.
    middle = range(2 * layers // 5, 3 * layers // 5)
    kept = ",".join(str(i) for i in range(layers) if i not in middle)
    skip = layerskip_drafter(model, kept)
    configs.append(Config(f"layer skip middle {len(middle)}/{layers}, heuristic", skip,
                          HeuristicScheduler(), 8, skip.model))
    log(f"SmolLM2-135M-Instruct: {len(prompts)} chat prompts, {args.smollm2_repeats} repeats")
    rows = measure(model, prompts, configs, args.smollm2_repeats, args.smollm2_tokens, log)
    entries = summarize(rows)
    print_table("SmolLM2-135M-Instruct (GGUF Q4_1 -> float32)", entries, log)
    return {"prompts": list(SMOLLM2_PROMPTS), "rows": entries,
            "texts": {row.config.label: [r.text for r in row.results] for row in rows[:1]}}


def _runtimes(text: str) -> list[str]:
    runtimes = [part.strip() for part in text.split(",") if part.strip()]
    if not runtimes or any(r not in RUNTIMES for r in runtimes):
        raise argparse.ArgumentTypeError(f"expected a comma list of {RUNTIMES}, got {text!r}")
    return runtimes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="Write every figure here.")
    parser.add_argument("--target", default="ar_target")
    parser.add_argument("--draft", default="ar_draft")
    parser.add_argument("--dllm", default="embedded", help="Diffusion drafter (same tokenizer).")
    parser.add_argument("--per-task", type=int, default=2, help="Test prompts per task.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--smollm2-repeats", type=int, default=1)
    parser.add_argument("--smollm2-tokens", type=int, default=48)
    parser.add_argument("--no-smollm2", action="store_true")
    parser.add_argument("--target-runtime", type=_runtimes, default=list(RUNTIMES),
                        help="comma list of target runtimes to measure, each a suite (default: hf,compact)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier timing).")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    def log(line: str) -> None:
        print(line, flush=True)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    report = {"threads": args.threads, "embedded": embedded_suite(args, log)}
    if not args.no_smollm2:
        report["smollm2"] = smollm2_suite(args, log)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        log(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
