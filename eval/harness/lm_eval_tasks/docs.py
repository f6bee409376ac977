"""Documents of the local lm-eval tasks, drawn from this repo's seeded task suite (no download).

lm-eval imports this file by path (`custom_dataset: !function docs.load` in the task YAMLs) and
calls `load` with the task's `dataset_kwargs` plus its metadata, which holds every `--model_args`
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
