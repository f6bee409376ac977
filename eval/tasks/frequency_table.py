"""The recipe of PC-Sampler's shipped frequency table for the embedded models' vocabulary: token
counts of the task suite's TRAIN split (prompts and answers; never the test split, which the
reference's corpus mixes in), under the embedded dLLM's tokenizer."""

from __future__ import annotations

from pathlib import Path

from dllm_decode.eval.tasks import TASKS
from dllm_decode.schedulers.frequency import SHIPPED, TABLES_DIR, build_frequency_table


def embedded_texts(per_task: int = 200, seed: int = 0) -> list[str]:
    """The table's text sample: `per_task` train examples of every task, prompt and answer."""
    texts: list[str] = []
    for task in TASKS.values():
        for example in task.examples("train", per_task, seed):
            texts += [example.prompt, example.answer]
    return texts


def build_embedded_table(path: str | Path | None = None, per_task: int = 200) -> Path:
    """Rebuild the shipped table (byte-identical for the same task suite and tokenizer)."""
    from dllm_decode.models.checkpoint import EMBEDDED_DIR, load_tokenizer

    tokenizer = load_tokenizer(EMBEDDED_DIR / "dllm")
    table = build_frequency_table(tokenizer, embedded_texts(per_task),
                                  source=f"task suite train split, {per_task} examples per task, seed 0, "
                                         f"prompts and answers")
    return table.save(path or TABLES_DIR / SHIPPED["embedded"])
