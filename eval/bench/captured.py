"""The captured step as a `bench shaped` variant: this project's loop with its model forward run
on static, bucketed buffers (`dllm_decode.capture`), recorded as CUDA graphs on a GPU.

`captured_decoder` returns the decode callable, or why the variant cannot run in this build or on
this device (a row that says so rather than a missing row), and the graph cache whose pool size
the report prints.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

NOT_BUILT = "not available: this build has no captured step (dllm_decode.capture)"


def capture_mode(device: torch.device, requested: str = "auto") -> str:
    """The capture mode a run uses: `auto` means `cuda-graphs` on CUDA and `static` (the bucketed
    step run eagerly: the captured path's buffers and padding, no compilation) elsewhere."""
    if requested != "auto":
        return requested
    return "cuda-graphs" if device.type == "cuda" else "static"


def captured_decoder(model: Any, config: Any, sync: Callable[[], None] | None, mode: str = "auto",
                     max_batch: int = 64) -> tuple[Callable[[list[list[int]]], Any] | None, str | None, Any]:
    """(decode, None, graphs) for the captured variant of `config` on `model`, or (None, why not,
    None)."""
    try:
        from dllm_decode.capture import GraphCache, capture_problem
    except ImportError:
        return None, NOT_BUILT, None
    from dllm_decode.sampler import generate

    if "capture" not in inspect.signature(generate).parameters:
        return None, "not available: generate() takes no capture argument in this build", None
    problem = capture_problem(config, model)
    if problem is not None:
        return None, f"not available: {problem}", None
    device = next(model.parameters()).device
    try:
        graphs = GraphCache(capture_mode(device, mode), max_batch=max_batch)
    except ValueError as err:
        return None, f"not available: {err}", None

    def decode(chunk: list[list[int]]) -> Any:
        from dllm_decode.eval.bench.outcome import ours

        return ours(model, chunk, config, sync, capture=graphs)

    return decode, None, graphs
