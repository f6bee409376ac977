"""Which executor runs a step: the one place that decides eager vs captured.

`executor_for` decides per decode (the cache and the model: a `capturable` cache with a plan, a
family with a captured forward), `fused_problem` per phase (whether the whole step, decision
included, runs in one graph, or only its forward with the decision on the host). A user who
asked for capture and gets eager is told why (`CaptureFallback`, one line).
"""

from __future__ import annotations

import warnings
from typing import Any

from dllm_decode.capture.denoise import CapturedDenoise, denoise_problem
from dllm_decode.capture.executor import CapturedExecutor
from dllm_decode.capture.graphs import CAPTURE_MODES, GraphCache
from dllm_decode.capture.step import Head
from dllm_decode.interfaces import Scheduler
from dllm_decode.models.compact import compact_problem
from dllm_decode.notices import Notice


class CaptureFallback(Notice):
    """Capture was asked for and this decode runs eagerly (the message says why)."""


def capture_problem(config: Any, model: Any) -> str | None:
    """Why a decode of `config` (a `DecodeConfig`, or just its `Cache`) on `model` cannot run
    the captured step (a phrase), or None when it can. The scheduler, filters and temperature
    never stop it: the decision can run on the host side of the step."""
    cache = getattr(config, "cache", config)
    if (problem := compact_problem(model)) is not None:
        return problem
    if getattr(model, "attention_backend", None) is not None:
        return "the model has an attention back end the captured forward does not run"
    try:
        Head.of(model)
    except TypeError as error:
        return str(error)
    if not type(cache).capturable:
        return (f"cache {type(cache).__name__} chooses its rows from the data (captured: the "
                f"caches with a plan: none, prefix, dual, block)")
    return None


def fused_problem(config: Any, model: Any, trace: bool = False) -> str | None:
    """Why a phase of `config` on `model` cannot run the whole step in one graph (a phrase:
    its decision then runs on the host after the captured forward), or None."""
    if (problem := capture_problem(config, model)) is not None:
        return problem
    scheduler = config.scheduler
    kind = type(scheduler)
    if not scheduler.capturable:
        return f"scheduler {kind.__name__} is not capturable"
    for hook in ("process_logits", "block_end", "init_state", "step_budget"):
        if getattr(kind, hook) is not getattr(Scheduler, hook):
            return f"scheduler {kind.__name__} has its own {hook}"
    if scheduler.lookahead_candidates or scheduler.guide or scheduler.needs_noise:
        return "the scheduler runs extra forwards or reads the sampling noise"
    if scheduler.revises != "none" or scheduler.view != "block" or scheduler.post_steps:
        return "the scheduler revises, edits after a block or looks past the block"
    if config.filters:
        return "filters run on the host"
    if trace:
        return "a trace records every step on the host"
    if getattr(model, "block_size", None):
        return "block-diffusion models decode on their grid (per-row blocks)"
    return None


def phase_problem(batch: Any, budgets: dict[int, int], model: Any, trace: bool) -> str | None:
    """Why this phase's requests (a `running.Batch`, their step `budgets`) cannot share one
    whole-step graph, or None: one rule and temperature, one budget, and `fused_problem`."""
    configs = [batch.members[g].config for g in batch.groups]
    first = configs[0]
    if any(c.scheduler != first.scheduler or c.temperature != first.temperature for c in configs):
        return "the batch's requests run different rules"
    if len({budgets[g] for g in batch.groups}) > 1:
        return "the batch's requests have different step budgets"
    return fused_problem(first, model, trace)


def executor_for(model: Any, cache: Any, capture: str | GraphCache) -> tuple[Any, str | None]:
    """What runs a decode's steps: `cache` itself (eager: `capture` "off", or a configuration
    the captured step cannot serve, whose reason comes second and is shown as a
    `CaptureFallback` warning) or a `CapturedExecutor`.

    Raises:
        ValueError: an unknown capture mode, or `cuda-graphs` without CUDA.
    """
    graphs = graph_cache(capture)
    if graphs is None:
        return cache, None
    if (problem := capture_problem(cache, model)) is not None:
        warnings.warn(CaptureFallback(f"capture {graphs.mode!r} runs eagerly: {problem}"), stacklevel=3)
        return cache, problem
    return CapturedExecutor(cache, model, graphs), None


def graph_cache(capture: Any) -> GraphCache | None:
    """The `GraphCache` a `capture` argument names (None for "off").

    Raises:
        TypeError / ValueError: not one of `CAPTURE_MODES` nor a `GraphCache`; `cuda-graphs`
            without CUDA.
    """
    if isinstance(capture, GraphCache):
        return capture
    if not isinstance(capture, str):
        raise TypeError(f"capture must be one of {list(CAPTURE_MODES)} or a GraphCache, got "
                        f"{type(capture).__name__}")
    if capture not in CAPTURE_MODES:
        raise ValueError(f"capture must be one of {list(CAPTURE_MODES)}, got {capture!r}")
    return None if capture == "off" else GraphCache(capture)


def denoise_for(model: Any, capture: str | GraphCache) -> Any:
    """What runs a uniform-noise model's decoder forward: `model.denoise` (capture "off", or a
    forward the capture cannot serve, said by a `CaptureFallback` warning) or a
    `CapturedDenoise`'s `denoise`.

    Raises:
        ValueError: an unknown capture mode, or `cuda-graphs` without CUDA.
    """
    graphs = graph_cache(capture)
    if graphs is None:
        return model.denoise
    problem = ("'regional' compiles one block of the masked families' compact stack"
               if graphs.mode == "regional" else denoise_problem(model))
    if problem is not None:
        warnings.warn(CaptureFallback(f"capture {graphs.mode!r} runs the noise decoder eagerly: {problem}"),
                      stacklevel=3)
        return model.denoise
    return CapturedDenoise(model, graphs).denoise
