"""Accuracy, NFE and wall-clock of several (model, decoding) pairs, measured side by side in one
run: every test prompt is decoded by every pair in turn, one prompt at a time, so a shared
machine's load falls on all pairs alike and the ratios between them are fair."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dllm_decode.config import DecodeConfig
from dllm_decode.sampler import generate

Progress = Callable[[str], None]


def suite_examples(per_task: int, seed: int = 0, split: str = "test") -> list:
    """`per_task` examples of every registered task's `split`, in registry order."""
    from dllm_decode.eval.tasks import TASKS

    return [e for task in TASKS.values() for e in task.examples(split, per_task, seed)]


def side_by_side(models: Mapping[str, Any], configs: Mapping[str, DecodeConfig], examples: list,
                 progress: Progress | None = None) -> dict[str, dict[str, float]]:
    """Decode every example with every model under every config (batch 1, interleaved).

    Args:
        models: name -> a DiffusionLM with a tokenizer (`load_model`).
        configs: name -> how to decode.
        examples: task examples (`suite_examples`); scored by their task's metric.
    Returns:
        `"<model> | <config>"` -> mean accuracy (%), NFE, tokens per step, answer tokens per
        step and seconds per prompt, the prompt count, and `by_task` accuracy (%).
    """
    from dllm_decode.eval.tasks import TASKS

    rows: dict[str, list[tuple[float, float, float, float, float]]] = {
        f"{m} | {c}": [] for m in models for c in configs}
    tasks = [example.task for example in examples]
    for i, example in enumerate(examples):
        score = TASKS[example.task].score
        for model_name, model in models.items():
            for config_name, config in configs.items():
                result = generate(model, [example.prompt], config)
                rows[f"{model_name} | {config_name}"].append((
                    100.0 * score(example, result.text[0]), float(result.nfe[0]),
                    float(result.tokens_per_step[0]), float(result.answer_tokens_per_step[0]),
                    result.seconds))
        if progress and ((i + 1) % 6 == 0 or i + 1 == len(examples)):
            progress(f"side by side: {i + 1}/{len(examples)} prompts")
    names = ("accuracy", "nfe", "tokens_per_step", "answer_tokens_per_step", "seconds")
    return {key: {**{n: sum(r[k] for r in rs) / max(len(rs), 1) for k, n in enumerate(names)},
                  "prompts": len(rs), "by_task": _by_task(tasks, [r[0] for r in rs])}
            for key, rs in rows.items()}


def _by_task(tasks: list[str], scores: list[float]) -> dict[str, float]:
    """Mean score per task, in first-seen order."""
    out: dict[str, list[float]] = {}
    for task, score in zip(tasks, scores):
        out.setdefault(task, []).append(score)
    return {task: sum(s) / len(s) for task, s in out.items()}


def format_table(table: Mapping[str, Mapping[str, float]]) -> str:
    """The side-by-side table as aligned text lines (accuracy, NFE, ms per prompt)."""
    width = max(len(k) for k in table)
    lines = [f"{'model | decoding':<{width}}  acc %    NFE  tok/step  ms/prompt"]
    for key, row in table.items():
        lines.append(f"{key:<{width}}  {row['accuracy']:5.1f}  {row['nfe']:5.2f}  "
                     f"{row['tokens_per_step']:8.1f}  {1000 * row['seconds']:9.1f}")
    return "\n".join(lines)


def command_model(name: str) -> Any:
    """The `--model` of the comparison commands (`python -m dllm_decode.eval.training.filter`,
    `... .onpolicy`), loaded; a name that does not load is a one-line usage error (exit 2)."""
    import click

    from dllm_decode.modelspec import ModelSpec, load_diffusion

    try:
        return load_diffusion(ModelSpec.parse(name))
    except ValueError as err:
        raise click.BadParameter(str(err).splitlines()[0], param_hint="--model") from None
