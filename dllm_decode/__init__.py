"""dllm-decode: fast, faithful decoding for masked diffusion LLMs (LLaDA / Dream style).

Dimension letters used in every docstring, shape comment and einops pattern:
    B batch, L canvas length (prompt + generation), P prompt length, G generation length,
    V vocabulary (logit columns), H heads, D head dim, W width of a step's logits window.
"""

from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.interfaces import Cache, Decision, DiffusionLM, Filter, Scheduler, StepInput
from dllm_decode.models import load_model
from dllm_decode.sampler import generate

__all__ = ["Cache", "Decision", "DecodeConfig", "DecodeResult", "DiffusionLM", "Filter", "Scheduler",
           "StepInput", "generate", "load_model"]
