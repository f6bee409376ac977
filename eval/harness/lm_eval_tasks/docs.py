"""Documents of the local lm-eval tasks, drawn from this repo's seeded task suite (no download).

lm-eval imports this file by path (`custom_dataset: !function docs.load` / `docs.load_mc` in the
task YAMLs) and calls the loader with the task's `dataset_kwargs` plus its metadata, which holds every `--model_args`
entry, hence the catch-all `**_`.
"""

from __future__ import annotations

from typing import Any


def load(dllm_task: str, dllm_n: int = 50, dllm_seed: int = 0, **_: Any) -> Any:
    """A `DatasetDict` with one `test` split of `dllm_n` examples of `dllm_decode.eval.tasks.TASKS[dllm_task]`.

    Args:
        dllm_task: a task of the suite whose reference answer is the only right one (`copy`,
            `sort`, ...): lm-eval's `exact_match` compares with that one answer.
        dllm_n, dllm_seed: as `Task.examples("test", n, seed)`, so every run sees the same list.
    Raises:
        KeyError: unknown task name.
    """
    import datasets

    from dllm_decode.eval.tasks import TASKS

    rows = [{"prompt": ex.prompt, "answer": ex.answer}
            for ex in TASKS[dllm_task].examples("test", int(dllm_n), int(dllm_seed))]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


CHOICES = 4


def load_mc(dllm_task: str, dllm_n: int = 100, dllm_seed: int = 0, **_: Any) -> Any:
    """A `DatasetDict` with one `test` split of multiple-choice documents: `prompt`, `choices`
    (the reference answer and three other orders of its words, shuffled by a seeded generator)
    and `label` (the answer's place). Examples whose words have fewer than four orders are
    skipped, so the split may hold fewer than `dllm_n`.

    Raises:
        KeyError: unknown task name.
    """
    import itertools
    import random

    import datasets

    from dllm_decode.eval.tasks import TASKS

    rng = random.Random(int(dllm_seed))
    rows = []
    for ex in TASKS[dllm_task].examples("test", int(dllm_n), int(dllm_seed)):
        orders = sorted({" ".join(p) for p in itertools.permutations(ex.answer.split())} - {ex.answer})
        if len(orders) < CHOICES - 1:
            continue
        choices = [ex.answer, *rng.sample(orders, CHOICES - 1)]
        rng.shuffle(choices)
        rows.append({"prompt": ex.prompt, "choices": choices, "label": choices.index(ex.answer)})
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
