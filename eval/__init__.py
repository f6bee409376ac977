"""Evaluation: ParallelBench-style tasks, the ideal analytic model, training recipes.

Import submodules explicitly (`from eval.tasks import TASKS`); never `import eval`, which would
shadow the builtin of the same name.
"""

__all__: list[str] = []
