"""dllm-decode: fast, faithful decoding for masked diffusion LLMs (LLaDA / Dream style).

Dimension letters used in every docstring, shape comment and einops pattern:
    B batch, L canvas length (prompt + generation), P prompt length, G generation length,
    V vocabulary (logit columns), H heads, D head dim, W width of a step's logits window.
"""

from dllm_decode.models import load_model

__all__ = ["load_model"]
