"""The DiffusionGemma sampler on a noise canvas: entropy-bound acceptance, re-noising, a linear
temperature schedule and the stable-and-confident stop (transformers 5.24
`generation_diffusion_gemma.py`: `EntropyBoundSampler`, `LinearTemperatureScheduleLogitsProcessor`,
`StableAndConfidentStoppingCriteria`; the acceptance is the EB-sampler, Ben-Hamu et al., 2025,
arXiv 2505.24857)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.noise import NoiseSchedule, token_entropy
from dllm_decode.fields import bounded


@dataclass(frozen=True)
class UniformNoiseScheduler(Scheduler):
    """Accept the lowest-entropy columns while `sum(H_1..H_k) - max(H_1..H_k) <= entropy_bound`
    (entropies of the tempered logits, sorted ascending with `torch.sort`, whose order among
    ties is the reference's); the loop writes the sampled token there and re-noises the rest.

    Options (the reference's defaults): `entropy_bound` 0.1; `steps` 48 per canvas at most;
    temperatures `t_max` 0.8 at the first step down to `t_min + (t_max - t_min) / steps` at the
    last (`t_min` 0.4); a row stops once its argmax canvas equals the last
    `stability_threshold` (1) ones and its mean entropy is below `confidence_threshold` (0.005).
    Runs only on a noise canvas (`dllm_decode.noise`). A checkpoint's own values come from its
    generation_config.json (`DecodeConfig.for_model`).
    """

    entropy_bound: float = 0.1
    steps: int = bounded(48, most=4096, scales="steps")
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = bounded(1, most=4096, scales="steps")
    confidence_threshold: float = 0.005
    canvas_kinds: ClassVar[tuple[str, ...]] = ("noise",)

    def __post_init__(self) -> None:
        if math.isnan(self.entropy_bound) or self.entropy_bound <= 0.0:
            raise ValueError(f"entropy_bound must be > 0, got {self.entropy_bound}")
        self.noise_schedule()                       # the schedule checks its own options

    def noise_schedule(self) -> NoiseSchedule:
        return NoiseSchedule(self.steps, self.t_min, self.t_max, self.stability_threshold,
                             self.confidence_threshold)

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        entropy = token_entropy(inp.logits)
        ranked, order = torch.sort(entropy, dim=-1)
        keep = ranked.cumsum(-1) - ranked <= self.entropy_bound
        accept = torch.zeros_like(keep).scatter(-1, order, keep)
        return Decision(commit=accept & inp.eligible), state
