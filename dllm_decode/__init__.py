"""dllm-decode: fast, faithful decoding for masked diffusion LLMs (LLaDA / Dream style).

Dimension letters used in every docstring, shape comment and einops pattern:
    B batch, L canvas length (prompt + generation), P prompt length, G generation length,
    V vocabulary (logit columns), H heads, D head dim, W width of a step's logits window.

The public names load on first use (PEP 562), so `import dllm_decode` and the command line's
`--help` do not wait for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

_EXPORTS = {
    "Cache": "dllm_decode.interfaces", "Decision": "dllm_decode.interfaces",
    "DiffusionLM": "dllm_decode.interfaces", "Filter": "dllm_decode.interfaces",
    "NoCache": "dllm_decode.interfaces", "Scheduler": "dllm_decode.interfaces",
    "StepInput": "dllm_decode.interfaces",
    "DecodeConfig": "dllm_decode.config", "DecodeResult": "dllm_decode.config",
    "Decoding": "dllm_decode.sampler", "NonFiniteLogits": "dllm_decode.errors",
    "generate": "dllm_decode.sampler",
    "load_model": "dllm_decode.models", "keep_freed_memory": "dllm_decode.allocator",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dllm_decode' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
