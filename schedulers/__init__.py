"""Unmasking schedulers: which masked positions to commit at each step."""

from dllm_decode.interfaces import Scheduler
from schedulers.factor import FactorScheduler
from schedulers.fixed_steps import (EntropyScheduler, LowConfidenceScheduler, MarginScheduler,
                                    RandomScheduler)
from schedulers.threshold import ThresholdScheduler

SCHEDULERS: dict[str, type[Scheduler]] = {
    "low_confidence": LowConfidenceScheduler,  # LLaDA: fixed tokens per step, most confident first
    "random": RandomScheduler,                 # LLaDA: fixed tokens per step, random positions
    "margin": MarginScheduler,                 # Dream topk_margin
    "entropy": EntropyScheduler,               # Dream entropy
    "threshold": ThresholdScheduler,           # Fast-dLLM confidence threshold (>=)
    "factor": FactorScheduler,                 # Fast-dLLM factor rule, vectorised
}

__all__ = ["SCHEDULERS", "EntropyScheduler", "FactorScheduler", "LowConfidenceScheduler",
           "MarginScheduler", "RandomScheduler", "ThresholdScheduler"]
