"""The captured step: a step on static, bucketed shapes, so that it compiles with
`torch.compile(fullgraph=True, dynamic=False)` and replays as a CUDA graph.

A cache plans which rows a step computes (`Cache.plan`); an executor runs the plan: the cache's
own eager forward, or `CapturedExecutor` (buckets, static buffers, graphs), which runs either the
step's forward (`captured_forward`, the decision then on the host) or the whole step
(`captured_step`: the same forward and the eager step's own functions). `Decoding(...,
capture=...)` / `generate(..., capture=...)` choose it (`CAPTURE_MODES`); the CLI's `--compile`
and `--cuda-graphs` too. `capture_problem(config, model)` says why a configuration runs eagerly,
`fused_problem` why a phase runs its decision on the host. A uniform-noise family's decoder
forward (DiffusionGemma) is captured by `CapturedDenoise` (`capture.denoise`), a drop-in for its
`denoise` that `denoise_for` chooses.
"""

from dllm_decode.capture.buckets import Buckets
from dllm_decode.capture.buffers import StepBuffers
from dllm_decode.capture.denoise import CapturedDenoise, denoise_problem
from dllm_decode.capture.dispatch import (CaptureFallback, capture_problem, denoise_for, executor_for,
                                          fused_problem, graph_cache, phase_problem)
from dllm_decode.capture.executor import CapturedExecutor
from dllm_decode.capture.graphs import CAPTURE_MODES, GraphCache
from dllm_decode.capture.step import Head, captured_forward, captured_step

__all__ = ["Buckets", "CAPTURE_MODES", "CaptureFallback", "CapturedDenoise", "CapturedExecutor",
           "GraphCache", "Head", "StepBuffers", "capture_problem", "captured_forward", "captured_step",
           "denoise_for", "denoise_problem", "executor_for", "fused_problem", "graph_cache", "phase_problem"]
