"""Evaluation: ParallelBench-style tasks, the ideal analytic model, training recipes.

Import submodules explicitly (`from dllm_decode.eval.tasks import TASKS`); never `import eval`, which would
shadow the builtin of the same name.
"""

from dllm_decode._namespace import require_namespaced

require_namespaced(__name__)

__all__: list[str] = []
