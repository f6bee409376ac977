"""Which formats a device runs, checked before a model is built."""

from __future__ import annotations

from typing import Any

import torch

from dllm_decode.quant.spec import QuantError, QuantSpec

FP8_CUDA_CAPABILITY = (8, 9)
"""FP8 matmuls (`torch._scaled_mm`, torchao's Float8Tensor kernels) need Ada or Hopper."""


def check_device_runs(spec: QuantSpec, device: Any) -> None:
    """Raise `QuantError` when `device` cannot run `spec`'s format.

    CPU runs all three (FP8 codes are dequantized by torchao's Float8Tensor there). On CUDA, FP8
    needs compute capability 8.9 or newer. Other accelerators have no float8 kernels here.
    """
    device = torch.device(device if device is not None else "cpu")
    if spec.format != "fp8" or device.type == "cpu":
        return
    if device.type == "cuda":
        index = device.index if device.index is not None else 0
        capability = tuple(torch.cuda.get_device_capability(index))
        if capability < FP8_CUDA_CAPABILITY:
            raise QuantError(f"fp8 needs a CUDA device of compute capability >= 8.9 (Ada, Hopper); "
                             f"{device} has {capability[0]}.{capability[1]}; use int8")
        return
    raise QuantError(f"fp8 runs on CPU and on CUDA (compute capability >= 8.9), not on "
                     f"{device.type}; use int8")
