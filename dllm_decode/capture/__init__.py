"""The captured step: the model forward of a denoising step on static, bucketed shapes, so that
it compiles with `torch.compile(fullgraph=True, dynamic=False)` and replays as a CUDA graph.

`Decoding(..., capture=...)` / `generate(..., capture=...)` run it (`CAPTURE_MODES`); the CLI's
`--compile` and `--cuda-graphs` choose it. `capture_problem(config, model)` says why a
configuration falls back to the eager forward.
"""

from dllm_decode.capture.buckets import Buckets
from dllm_decode.capture.buffers import StepBuffers
from dllm_decode.capture.graphs import CAPTURE_MODES, GraphCache
from dllm_decode.capture.loop import fused_decoder, fused_generate, fused_problem
from dllm_decode.capture.runtime import CapturedCache, capture_problem, captured_cache, graph_cache
from dllm_decode.capture.step import Head, captured_forward

__all__ = ["Buckets", "CAPTURE_MODES", "CapturedCache", "GraphCache", "Head", "StepBuffers",
           "capture_problem", "captured_cache", "captured_forward", "fused_decoder",
           "fused_generate", "fused_problem", "graph_cache"]
