"""Uniform-noise canvases (DiffusionGemma): the step schedule, the checks a request passes, and
the end-of-text rules of a committed canvas.

On a masked canvas an uncommitted column holds [MASK] and a commit is final. On a noise canvas
(a model with `canvas_kind = "noise"`) every uncommitted column holds a uniformly random token,
redrawn every step: each step the decoder predicts the whole canvas, a rule (the request's
scheduler, through its usual `select`) accepts columns, accepted columns take the sampled token
and every other column is re-noised. A canvas ends when every row of the request is stable and
confident (`NoiseSchedule`) or its step budget is spent; its ARGMAX is committed, encoded into
the request's cache, and the next canvas starts (transformers 5.24
`DiffusionGemmaForBlockDiffusion.generate`). The loop runs it like any canvas
(`dllm_decode.canvas`); the step itself is `dllm_decode.noise_turn`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import NoCache, Scheduler

CANVAS_KINDS = ("mask", "noise")


@dataclass(frozen=True)
class NoiseSchedule:
    """How a noise canvas steps: `steps` at most, temperature `t_min + (t_max - t_min) * n /
    steps` with n the steps remaining (first step `t_max`), and a row stops once its argmax
    canvas equals each of the last `stability_threshold` ones and the mean entropy of its
    tempered logits is below `confidence_threshold` (the reference's defaults)."""

    steps: int = 48
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if not 0.0 <= self.t_min < self.t_max:
            raise ValueError(f"temperatures must satisfy 0 <= t_min < t_max, got t_min "
                             f"{self.t_min}, t_max {self.t_max}")
        if isinstance(self.stability_threshold, bool) or not isinstance(self.stability_threshold, int) \
                or self.stability_threshold < 0:
            raise ValueError(f"stability_threshold must be an integer >= 0, got {self.stability_threshold!r}")
        if not self.confidence_threshold > 0.0:
            raise ValueError(f"confidence_threshold must be > 0, got {self.confidence_threshold}")

    def temperature(self, remaining: int) -> Tensor:
        """The 0-d float32 temperature with `remaining` steps left (the reference's arithmetic)."""
        fraction = torch.tensor(remaining, dtype=torch.int32) / self.steps
        return self.t_min + (self.t_max - self.t_min) * fraction

    def stop(self, history: Tensor, argmax: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        """(B,) rows stable and confident now, and the argmax history with `argmax` appended."""
        if self.stability_threshold == 0:
            stable = torch.ones(argmax.shape[0], dtype=torch.bool, device=argmax.device)
        else:
            stable = (history == argmax[None]).all(-1).all(0)
            history = torch.cat([history[1:], argmax[None]])
        confident = token_entropy(logits).mean(-1) < self.confidence_threshold
        return stable & confident, history


def token_entropy(logits: Tensor) -> Tensor:
    """(B, C) entropy of each column's categorical (torch.distributions' formula, bit for bit
    the reference's, so sorts and threshold comparisons agree)."""
    return torch.distributions.Categorical(logits=logits, validate_args=False).entropy()


def canvas_kind(model: Any) -> str:
    """"noise" for a uniform-noise model, else "mask"."""
    return getattr(model, "canvas_kind", "mask")


def check_canvas(model: Any, config: DecodeConfig) -> None:
    """Raise a one-line ValueError when the request's scheduler does not run on the model's
    canvas kind, or (noise canvas) asks for what it does not have: a cache, filters, a flat
    temperature (the schedule sets its own), blocks other than the model's canvas."""
    kind, scheduler = canvas_kind(model), config.scheduler
    if kind not in scheduler.canvas_kinds:
        raise ValueError(f"scheduler {type(scheduler).__name__} does not run on a {kind} canvas "
                         f"(it runs on {list(scheduler.canvas_kinds)})")
    if kind != "noise":
        return
    if not isinstance(config.cache, NoCache):
        raise ValueError("a noise canvas reads its own encoder cache of committed canvases; use cache 'none'")
    if config.filters:
        raise ValueError("filters do not run on a noise canvas; pass none")
    if config.temperature != 0.0:
        raise ValueError("a noise canvas follows its schedule's temperatures (t_min, t_max); "
                         "leave temperature at 0")
    if config.block_length != model.canvas_length:
        raise ValueError(f"block_length must be the model's canvas_length {model.canvas_length}, "
                         f"got {config.block_length}")


def schedule_of(scheduler: Scheduler, model: Any) -> NoiseSchedule:
    """The scheduler's own schedule (`noise_schedule()`), else the model's shipped one."""
    own = getattr(scheduler, "noise_schedule", None)
    if callable(own):
        return own()
    shipped = getattr(model, "generation_defaults", {}) or {}
    names = {"max_denoising_steps": "steps", "t_min": "t_min", "t_max": "t_max",
             "stability_threshold": "stability_threshold", "confidence_threshold": "confidence_threshold"}
    return NoiseSchedule(**{names[k]: v for k, v in shipped.items() if k in names})


def finalize(block: Tensor, finished: Tensor, eos: Tensor, pad: int | None) -> tuple[Tensor, Tensor]:
    """The committed canvas after the reference's end-of-text rules, and the rows now finished."""
    is_eos = torch.isin(block, eos)
    now = finished | is_eos.any(-1)
    if pad is not None and bool(now.any()):
        seen = is_eos.cumsum(-1)
        after = (seen > 0) & ~((seen == 1) & is_eos)
        block = block.masked_fill(after & (now & ~finished)[:, None], pad)
        block = block.masked_fill(finished[:, None], pad)
    return block, now
