"""Evaluation, installed as `dllm_decode.eval`, in rooms:

* `tasks`: the ParallelBench-style task suite, released-file sources, the word-level tokenizer;
* `harness`: the decoding grid, the resumable data-parallel runner, records, summaries, reports,
  plots, tuned presets, the lm-evaluation-harness adapter;
* `theory`: the ideal analytic model and the accuracy curves it predicts;
* `bench`: the benchmarks behind `dllm-decode bench`;
* `training`: the Learn2PD filter's training behind `dllm-decode train-filter` (the recipes that
  trained the embedded models sit in `recipes/` at the repository root, not installed).

Import submodules explicitly (`from dllm_decode.eval.tasks import TASKS`).
"""

from dllm_decode._namespace import require_namespaced

require_namespaced(__name__)
