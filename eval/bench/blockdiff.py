"""`bench bd`: the block-diffusion model against its AR parent and the LLaDA-style dLLM.

Fast-dLLM v2 (arXiv 2509.26328) claims a block-diffusion model converted from an AR model keeps
the AR model's accuracy while decoding several tokens per forward. Here the three shipped models
decode the same task-suite test prompts, batch 1, greedy, in one interleaved run
(`timing.interleave`: every row sees the same load drifts):

* the AR target, plain greedy with a KV cache in the compact runtime (the fair AR baseline);
* the embedded dLLM (LLaDA-style, block 32) under the threshold rule at 0.9, no cache and dual;
* the block-diffusion model (`embedded-bd`, block 8, the same weights' lineage as the AR target)
  at one token per step and under the threshold rule, without and with the exact block cache.

The diffusion rows run at each `--gen-length` (the embedded models' native canvas is 32); the
AR row stops at its end-of-text whatever the budget. Per row: mean accuracy over tasks, model
forwards per answer token (tokens before the first end-of-text), wall-clock per sample, and the
speedup over the AR row (a ratio of medians over repeats).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dllm_decode.config import DecodeConfig
from dllm_decode.eval.bench.measure import Sample
from dllm_decode.eval.bench.subject import scored, task_samples
from dllm_decode.eval.bench.timing import check_counts, interleave, speedup

AR_LABEL = "AR target greedy (compact)"


@dataclass(frozen=True)
class BlockDiffOptions:
    """One configuration of `bench bd`.

    Attributes:
        bd, ar, dllm: the block-diffusion model, its AR parent (a causal LM name) and the
            LLaDA-style dLLM (`load_model` / `load_causal_lm` names or directories).
        gen_lengths: the diffusion rows' canvases; the AR budget is the longest.
        per_task: test prompts per task, every task of the suite.
        repeats: interleaved repeats.
        threshold: the threshold rule's confidence for both diffusion models.
    Raises:
        ValueError: a count below 1 or a threshold outside (0, 1].
    """

    bd: str = "embedded-bd"
    ar: str = "ar_target"
    dllm: str = "embedded"
    gen_lengths: tuple[int, ...] = (256, 32)
    per_task: int = 4
    repeats: int = 3
    threshold: float = 0.9
    seed: int = 0

    def __post_init__(self) -> None:
        check_counts(self, "per_task", "repeats")
        if not self.gen_lengths or min(self.gen_lengths) < 8:
            raise ValueError(f"gen lengths must be >= 8 (one block of the bd model), got {list(self.gen_lengths)}")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")


@dataclass(frozen=True)
class Outcome:
    """One decode: the answer text, answer tokens (before end-of-text) and model forwards."""

    text: str
    answer_tokens: int
    forwards: int


def diffusion_rows(o: BlockDiffOptions, bd: Any, dllm: Any) -> dict[str, tuple[Any, DecodeConfig]]:
    """label -> (model, decode record) for every diffusion row."""
    from dllm_decode.caches import CACHES
    from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler

    rows: dict[str, tuple[Any, DecodeConfig]] = {}
    threshold = ThresholdScheduler(o.threshold)
    for gen in o.gen_lengths:
        rows[f"dLLM threshold {o.threshold:g}, gen {gen}"] = (
            dllm, DecodeConfig(scheduler=threshold, gen_length=gen, block_length=min(32, gen)))
        rows[f"dLLM threshold {o.threshold:g} + dual, gen {gen}"] = (
            dllm, DecodeConfig(scheduler=threshold, cache=CACHES["dual"](), gen_length=gen,
                               block_length=min(32, gen)))
        block = bd.block_size
        rows[f"BD one token per step + block cache, gen {gen}"] = (
            bd, DecodeConfig(scheduler=LowConfidenceScheduler(), cache=CACHES["block"](),
                             gen_length=gen, block_length=block))
        rows[f"BD threshold {o.threshold:g}, gen {gen}"] = (
            bd, DecodeConfig(scheduler=threshold, gen_length=gen, block_length=block))
        rows[f"BD threshold {o.threshold:g} + block cache, gen {gen}"] = (
            bd, DecodeConfig(scheduler=threshold, cache=CACHES["block"](), gen_length=gen,
                             block_length=block))
    return rows


@dataclass(frozen=True)
class Models:
    """The three models under test (the AR target already in the compact runtime)."""

    bd: Any
    target: Any
    dllm: Any


def load_models(o: BlockDiffOptions) -> Models:
    """Load the options' three models.

    Raises:
        ModelLoadError: a model that is not installed, or a `bd` model without a block size.
    """
    from dllm_decode.models import ModelLoadError, load_model
    from dllm_decode.speculative import with_runtime
    from dllm_decode.models.causal import load_causal_lm

    bd = load_model(o.bd)
    if getattr(bd, "block_size", None) is None:
        raise ModelLoadError(f"{o.bd!r} is not a block-diffusion model (its config has no block size)")
    return Models(bd, with_runtime(load_causal_lm(o.ar), "compact"), load_model(o.dllm))


def run_blockdiff(o: BlockDiffOptions, models: Models, say: Callable[[str], None] = lambda line: None,
                  clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """The benchmark; the JSON-ready report (`rows`, the AR row first)."""
    from dllm_decode.eval.tasks import TASKS
    from dllm_decode.prompts import chat_prompt
    from dllm_decode.sampler import generate
    from dllm_decode.schedulers import LowConfidenceScheduler
    from dllm_decode.speculative import SpecConfig, speculative_generate
    from dllm_decode.speculative.loop import eos_ids_of

    bd, target, dllm = models.bd, models.target, models.dllm
    samples = task_samples(TASKS, o.per_task, seed=o.seed)
    rows = diffusion_rows(o, bd, dllm)
    eos = eos_ids_of(target, target.tokenizer)
    ar_config = SpecConfig(LowConfidenceScheduler(steps_per_block=1), max_new_tokens=max(o.gen_lengths))

    def prompt_for(model: Any, sample: Sample) -> str:
        return chat_prompt(model.tokenizer, sample.example.prompt)

    def job(label: str, index: int, sample: Sample) -> Callable[[], Outcome]:
        if label == AR_LABEL:
            text = prompt_for(target, sample)

            def ar() -> Outcome:
                result = speculative_generate(target, text, ar_config)
                return Outcome(result.text or "", answer_length(result.tokens.tolist(), eos),
                               result.target_forwards)
            return ar
        model, config = rows[label]
        text = prompt_for(model, sample)

        def diffusion() -> Outcome:
            result = generate(model, [text], config)
            return Outcome(result.text[0], int(result.answer_lengths[0]), int(result.nfe[0]))
        return diffusion

    labels = [AR_LABEL, *rows]
    say(f"{len(samples)} prompts, {len(labels)} rows, {o.repeats} interleaved repeat(s), batch 1")
    runs = interleave([(label, samples) for label in labels], o.repeats, job, clock)
    out = []
    for label in labels:
        outcomes = runs[label].values()
        answer = sum(x.answer_tokens for x in outcomes)
        out.append({"label": label,
                    "accuracy": scored(TASKS, samples, [x.text for x in outcomes]),
                    "forwards_per_answer_token": sum(x.forwards for x in outcomes) / max(answer, 1),
                    "answer_tokens": statistics.fmean(x.answer_tokens for x in outcomes),
                    "forwards": statistics.fmean(x.forwards for x in outcomes),
                    "seconds_per_sample": runs[label].seconds() / len(samples),
                    "speedup_vs_ar": speedup(runs[AR_LABEL], runs[label])})
    return {"models": {"bd": o.bd, "ar": o.ar, "dllm": o.dllm}, "prompts": len(samples),
            "options": {"gen_lengths": list(o.gen_lengths), "per_task": o.per_task,
                        "repeats": o.repeats, "threshold": o.threshold, "bd_block": bd.block_size},
            "rows": out}


def answer_length(tokens: Sequence[int], eos_ids: Sequence[int]) -> int:
    """Tokens before the first end-of-text (all of them when there is none)."""
    return next((i for i, t in enumerate(tokens) if t in eos_ids), len(tokens))


def format_blockdiff(report: dict[str, Any]) -> str:
    """The report as a table, one line per row."""
    width = max(len(r["label"]) for r in report["rows"]) + 1
    lines = [f"{report['prompts']} prompts, batch 1, greedy; forwards per answer token, seconds per "
             f"sample, speedup over {AR_LABEL}",
             f"{'row':<{width}}{'acc %':>7}{'fwd/tok':>9}{'tok':>6}{'s/sample':>10}{'vs AR':>8}"]
    for r in report["rows"]:
        acc = r["accuracy"]["mean"] if r["accuracy"] else float("nan")
        lines.append(f"{r['label']:<{width}}{acc:>7.1f}{r['forwards_per_answer_token']:>9.2f}"
                     f"{r['answer_tokens']:>6.1f}{r['seconds_per_sample']:>10.4f}{r['speedup_vs_ar']:>7.2f}x")
    return "\n".join(lines)
