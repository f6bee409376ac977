"""Unmasking schedulers: which masked positions to commit at each step."""

from dllm_decode.interfaces import Scheduler
from schedulers.adaptive_block import AdaptiveBlockScheduler, delimiter_ids, with_delimiters
from schedulers.credit import CreditScheduler
from schedulers.early_commit import EarlyCommitScheduler
from schedulers.eb import EntropyBoundScheduler
from schedulers.factor import FactorScheduler
from schedulers.fixed_steps import (EntropyScheduler, LowConfidenceScheduler, MarginScheduler,
                                    RandomScheduler)
from schedulers.klass import KLASSScheduler
from schedulers.local_leap import LocalLeapScheduler
from schedulers.oracle import OracleScheduler, oracle_reference
from schedulers.threshold import ThresholdScheduler
from schedulers.wrapper import Wrapper

SCHEDULERS: dict[str, type[Scheduler]] = {
    "low_confidence": LowConfidenceScheduler,  # LLaDA: fixed tokens per step, most confident first
    "random": RandomScheduler,                 # LLaDA: fixed tokens per step, random positions
    "margin": MarginScheduler,                 # Dream topk_margin
    "entropy": EntropyScheduler,               # Dream entropy
    "threshold": ThresholdScheduler,           # Fast-dLLM confidence threshold (>=)
    "factor": FactorScheduler,                 # Fast-dLLM factor rule, vectorised
    "credit": CreditScheduler,                 # CreditDecoding: credit-fused logits, any base rule
    "local_leap": LocalLeapScheduler,          # LocalLeap: anchors relax their neighbours' bar
    "adaptive_block": AdaptiveBlockScheduler,  # AdaBlock: block ends on a confident delimiter
    "early_commit": EarlyCommitScheduler,      # Prophet: all-in once the answer's logit gap is large
    "eb": EntropyBoundScheduler,               # EB-sampler: entropy-bounded sorted prefix
    "klass": KLASSScheduler,                   # KLASS: confident and KL-stable positions
    "oracle": OracleScheduler,                 # Learn2PD oracle: commit what matches a reference
}

__all__ = ["SCHEDULERS", "AdaptiveBlockScheduler", "CreditScheduler", "EarlyCommitScheduler",
           "EntropyBoundScheduler", "EntropyScheduler", "FactorScheduler", "KLASSScheduler",
           "LocalLeapScheduler", "LowConfidenceScheduler", "MarginScheduler", "OracleScheduler",
           "RandomScheduler", "ThresholdScheduler", "Wrapper", "delimiter_ids", "oracle_reference",
           "with_delimiters"]
