"""PC-Sampler, renamed Uncode: position-aware calibration of decoding bias (2025,
arXiv 2508.13021; code `NEUIR/PC-Sampler@8b106b0: src/generate.py`, `pc_sampler_function`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.fields import file_option
from dllm_decode.interfaces import StepInput
from dllm_decode.schedulers.fixed_steps import _FixedSteps
from dllm_decode.schedulers.frequency import AUTO, SHIPPED, UNIFORM, check_table, log_frequency

ORIGINS = ("generation", "block")


@dataclass(frozen=True)
class PCSamplerScheduler(_FixedSteps):
    """LLaDA's fixed-count schedule, ranked by a position-decayed, frequency-calibrated confidence.

    score_i = exp(-decay * pos_i) * min(-c_i ln f(x̂_i), clip), with c_i the candidate's
    probability, f a background unigram frequency table (`schedulers/frequency.py`; rare tokens
    score higher) and pos_i the column's offset; the top `count(step)` eligible columns commit
    (LLaDA's `steps / num_blocks` schedule; ties to the lower column). A quality method at one
    token per step (the default), not a speed method.

    Defaults are the scripts': decay 0.25 (HumanEval, MBPP, MATH-500, GSM8K, GPQA; 0 for Sudoku, 1
    for Countdown where the README says 0.5), clip 10, one token per step. The table is
    tokenizer-specific: `table="auto"` (the default) takes the shipped table recorded for a
    vocabulary of the model's size, which is `"embedded"` for the embedded and ideal models
    (counted on the task suite's train split, recipe `eval/tasks/frequency_table.py`), and runs
    `"uniform"` (f = 1/V: no calibration) with a warning for any other model; any other value is a
    `.safetensors` or reference `.json` file built for the model's tokenizer (a table built for
    another vocabulary is refused before the request, in one line).

    Deviations: the score is ranked in log space, -decay * pos + ln min(-c ln f, clip), the same
    order wherever the reference's float product is positive, without its float32 underflow (it
    reaches 0 and ties every far column once decay * pos > ~104: gen 1024 at decay 0.25);
    `origin="generation"` measures pos from the generation start (the README's i - |p0|), the
    code's block-relative offset is `origin="block"` (the two agree when block = generation, every
    published script); the confidence is the clean float32 softmax (bf16 in the reference); the
    table is cached per (table, vocabulary, device) instead of in one module global that ignores a
    second table; the linear-position and random-confidence variants are not offered. A uniform
    table with clip = inf and decay 0 ranks like `low_confidence`.
    """

    decay: float = 0.25
    clip: float = 10.0
    table: str = file_option(AUTO, names=(UNIFORM, *SHIPPED))   # start-up only: opens a file
    origin: str = "generation"
    smoothing: float = 0.0
    infinite_ok = ("clip",)

    def __post_init__(self) -> None:
        super().__post_init__()
        if math.isnan(self.decay) or self.decay < 0.0:
            raise ValueError(f"decay must be >= 0, got {self.decay}")
        if math.isnan(self.clip) or self.clip <= 0.0:
            raise ValueError(f"clip must be in (0, inf], got {self.clip}")
        if self.origin not in ORIGINS:
            raise ValueError(f"origin must be one of {', '.join(ORIGINS)}, got {self.origin!r}")
        if self.smoothing < 0.0:
            raise ValueError(f"smoothing must be >= 0 (add-k; 0 is the reference's 1/N floor), got {self.smoothing}")
        if not self.table:
            raise ValueError("table must name a shipped table ('embedded') or a table file")

    def check_fits(self, vocab_size: int, gen_length: int) -> None:
        check_table(self.table, vocab_size)

    def score(self, inp: StepInput) -> Tensor:
        log_f = log_frequency(self.table, inp.probs.shape[-1], self.smoothing, str(inp.probs.device))
        calibrated = -inp.confidence.clamp_min(0) * log_f[inp.candidates]
        start = inp.gen_span[:, :1] if self.origin == "generation" else inp.block[:, :1]
        position = (inp.columns - start).clamp_min(0).to(torch.float64)
        return (calibrated.clamp(max=self.clip).double().log() - self.decay * position).float()
