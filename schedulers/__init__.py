"""Unmasking schedulers: which masked positions to commit at each step."""

from dllm_decode._namespace import require_namespaced

require_namespaced(__name__)

from dllm_decode.interfaces import Scheduler
from dllm_decode.schedulers.adaptive_block import AdaptiveBlockScheduler, delimiter_ids, with_delimiters
from dllm_decode.schedulers.apd import APDScheduler
from dllm_decode.schedulers.credit import CreditScheduler
from dllm_decode.schedulers.dcd import DCDScheduler
from dllm_decode.schedulers.dus import DUSScheduler
from dllm_decode.schedulers.early_commit import EarlyCommitScheduler
from dllm_decode.schedulers.edit import EditScheduler
from dllm_decode.schedulers.eb import EntropyBoundScheduler
from dllm_decode.schedulers.entropy_threshold import EntropyThresholdScheduler
from dllm_decode.schedulers.factor import FactorScheduler
from dllm_decode.schedulers.frechet import FrechetScheduler
from dllm_decode.schedulers.hierarchy import HierarchyScheduler
from dllm_decode.schedulers.fixed_steps import (EntropyScheduler, LowConfidenceScheduler, MarginScheduler,
                                    RandomScheduler)
from dllm_decode.schedulers.info_gain import InfoGainScheduler
from dllm_decode.schedulers.klass import KLASSScheduler
from dllm_decode.schedulers.leap import LEAPScheduler
from dllm_decode.schedulers.less import LESSScheduler
from dllm_decode.schedulers.local_leap import LocalLeapScheduler
from dllm_decode.schedulers.lsp import LSPScheduler
from dllm_decode.schedulers.multi_block import MultiBlockScheduler
from dllm_decode.schedulers.oracle import OracleScheduler, oracle_reference
from dllm_decode.schedulers.pc_sampler import PCSamplerScheduler
from dllm_decode.schedulers.remdm import ReMDMScheduler
from dllm_decode.schedulers.saber import SaberScheduler
from dllm_decode.schedulers.said import SAIDScheduler
from dllm_decode.schedulers.slowfast import SlowFastScheduler
from dllm_decode.schedulers.threshold import ThresholdScheduler
from dllm_decode.schedulers.uniform_noise import UniformNoiseScheduler
from dllm_decode.schedulers.wino import WinoScheduler
from dllm_decode.schedulers.wrapper import Wrapper

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
    "entropy_threshold": EntropyThresholdScheduler,  # dParallel: entropy <= tau, at least the lowest
    "klass": KLASSScheduler,                   # KLASS: confident and KL-stable positions
    "oracle": OracleScheduler,                 # Learn2PD oracle: commit what matches a reference
    "edit": EditScheduler,                     # LLaDA2.1: M2T threshold + token-to-token edits
    "saber": SaberScheduler,                   # Saber: running-mean bar + backtracking (no cache)
    "wino": WinoScheduler,                     # WINO: wide-in threshold + narrow-out re-masking in the block
    "dus": DUSScheduler,                       # DUS: dilated groups, one per step (log-many forwards per block)
    "pc_sampler": PCSamplerScheduler,          # PC-Sampler/Uncode: position-decayed, frequency-calibrated top-k
    "slowfast": SlowFastScheduler,             # SlowFast: explore a span, then fill it in parallel
    "hierarchy": HierarchyScheduler,           # dInfer: each masked segment's best above a low bar + a high bar
    "multi_block": MultiBlockScheduler,        # d3LLM/D2F: pipelined sub-blocks, entropy gate
    "frechet": FrechetScheduler,               # Fast-dLLM++: Frechet-profile certificate on the sorted prefix
    "less": LESSScheduler,                     # LESS: confident, persistent and JS-stable positions (provisional)
    "info_gain": InfoGainScheduler,            # Info-Gain: one-step look-ahead over candidate actions (no cache)
    "apd": APDScheduler,                       # APD: longest draft prefix the dLLM x small-AR product accepts
    "remdm": ReMDMScheduler,                   # ReMDM (LLaDA port): extra loop steps re-mask the least confident commits
    "uniform_noise": UniformNoiseScheduler,    # DiffusionGemma: entropy-bound accept + re-noise (noise canvas only)
    "lsp": LSPScheduler,                       # LSP: the longest stable run from the frontier, snapped to a delimiter
    "said": SAIDScheduler,                     # SAID: checkerboard scaffold stages first, details in few steps
    "leap": LEAPScheduler,                     # LEAP: + below-bar candidates that agree across look-ahead futures
    "dcd": DCDScheduler,                       # DCD: a certainty-aware sliding window instead of hard blocks
}

MASK_SCHEDULERS: dict[str, type[Scheduler]] = {n: c for n, c in SCHEDULERS.items() if "mask" in c.canvas_kinds}
"""The rules that run on a masked canvas (every family but the uniform-noise DiffusionGemma)."""
NOISE_SCHEDULERS: dict[str, type[Scheduler]] = {n: c for n, c in SCHEDULERS.items() if "noise" in c.canvas_kinds}
"""The rules that run on a uniform-noise canvas (`dllm_decode.noise`)."""

__all__ = ["MASK_SCHEDULERS", "NOISE_SCHEDULERS", "SCHEDULERS", "APDScheduler", "AdaptiveBlockScheduler", "CreditScheduler", "DCDScheduler", "DUSScheduler", "EarlyCommitScheduler", "EditScheduler",
           "EntropyBoundScheduler", "EntropyScheduler", "EntropyThresholdScheduler", "FactorScheduler",
           "FrechetScheduler", "HierarchyScheduler", "InfoGainScheduler", "KLASSScheduler", "LEAPScheduler", "LESSScheduler", "MultiBlockScheduler",
           "PCSamplerScheduler", "ReMDMScheduler", "SlowFastScheduler",
           "LSPScheduler", "LocalLeapScheduler", "LowConfidenceScheduler", "MarginScheduler", "OracleScheduler",
           "RandomScheduler", "SAIDScheduler", "SaberScheduler", "ThresholdScheduler", "UniformNoiseScheduler", "WinoScheduler", "Wrapper", "delimiter_ids", "oracle_reference",
           "with_delimiters"]
