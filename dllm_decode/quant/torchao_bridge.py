"""The one place that builds torchao 0.18's weight tensor subclasses from plain codes.

torchao (pytorch/ao) is PyTorch's own quantization library: its subclasses route `F.linear` to
the kernels each device has (aten's CPU int4 kernel, `torch._scaled_mm` for FP8 on Hopper), so
this package writes no kernels. Its serialization is not used: `Int4OpaqueTensor` does not save
with safetensors, and a packed layout is device specific, so checkpoints hold plain codes and the
subclasses are derived at run time (int8 and fp8 wrap the codes without a copy).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
from typing import Iterator

import torch
from torch import Tensor

from dllm_decode.quant.codes import float_zero, unpack_int4

_NOISY = ("torchao", "torch.utils._pytree")
"""Loggers torchao's import talks through: CUDA-only libraries it fails to load on a CPU build
(harmless) and a torch deprecation notice."""


@functools.lru_cache(maxsize=None)
def torchao_available() -> bool:
    """Whether torchao is installed (the `quant` extra); without it every layer dequantizes."""
    return importlib.util.find_spec("torchao") is not None


@contextlib.contextmanager
def _quiet_import() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _NOISY]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def int8_tensor(q: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    with _quiet_import():
        from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor

    return Int8Tensor(q, scale, [1, q.shape[1]], dtype)


def float8_tensor(q: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    with _quiet_import():
        from torchao.quantization import Float8Tensor

    return Float8Tensor(q, scale, [1, q.shape[1]], dtype=dtype)


def int4_cpu_tensor(packed: Tensor, scale: Tensor, zero: Tensor, group_size: int,
                    shape: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """`Int4OpaqueTensor` (CPU): the codes repacked for `_weight_int4pack_mm_for_cpu`, scale and
    float zero (`codes.float_zero` of the integer zero point) interleaved as its (K/G, N, 2)
    table in the activation dtype."""
    with _quiet_import():
        from torchao.prototype.quantization.int4.int4_opaque_tensor import Int4OpaqueTensor

    opaque = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpack_int4(packed), 1)
    table = torch.stack([scale.to(dtype), float_zero(scale, zero).to(dtype)], -1).transpose(0, 1).contiguous()
    return Int4OpaqueTensor(qdata=opaque, scale_and_zero=table, block_size=[1, group_size],
                            shape=torch.Size(shape))
