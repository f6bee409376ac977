"""Round-to-nearest weight codes and their dequantization, in the plain tensors a quantized
checkpoint stores (no tensor subclasses: they save with safetensors and shard like any tensor).

    int8  q int8 (N, K),            scale float16 (N, 1):  W = q * scale
    fp8   q float8_e4m3fn (N, K),   scale float16 (N, 1):  W = float(q) * scale
    int4  q uint8 (N, K/2) two codes per byte (even k in the low nibble), scale float16 and
          integer zero point uint8 (N, K/G):  W[n, k] = (code[n, k] - zero[n, k // G]) * scale[n, k // G]

Scales are float16, as GPTQ checkpoints store them (10 mantissa bits: a scale's own rounding is
far below a code step); codes are computed from the stored (rounded) scales. The int4 zero point
is GPTQ's: an integer on the code grid (asymmetric min/max: scale = (max - min) / 15, zero =
round(-min / scale) in 0..15), one byte per group where a float zero took two (GPTQ packs it in
4 bits; one unpacked byte keeps odd group counts simple). At group 64 a weight then costs
0.5 + 3/64 bytes per value, 0.273x of bf16 (a float16 zero: 0.281x).

The CPU int4 kernel (`aten._weight_int4pack_mm_for_cpu`, torchao's `Int4OpaqueTensor`) takes codes
0..15 around a float zero; the integer zero maps onto it exactly: `scale * (q - z) = (q - 8) *
scale + scale * (8 - z)` (`float_zero`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
SCALE_DTYPE = torch.float16
ZERO_DTYPE = torch.uint8


class Codes(NamedTuple):
    """One weight's stored tensors (`zero` only for int4)."""

    q: Tensor
    scale: Tensor
    zero: Tensor | None = None


def quantize_weight(w: Tensor, fmt: str, group_size: int | None = None,
                    row_max: Callable[[Tensor], Tensor] | None = None) -> Codes:
    """Round-to-nearest codes of a (N, K) weight. `row_max` combines the per-row maxima of a
    row-parallel shard across the ranks holding the row's other columns (None: `w` is whole)."""
    w = w.detach().float()
    absmax = w.abs().amax(1, keepdim=True)
    if row_max is not None and fmt != "int4":
        absmax = row_max(absmax)
    if fmt == "int8":
        scale = _stored(absmax / 127)
        return Codes((w / scale.float()).round().clamp(-127, 127).to(torch.int8), scale)
    if fmt == "fp8":
        scale = _stored(absmax / FP8_MAX)
        return Codes((w / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale)
    if fmt == "int4":
        scale, zero = int4_params(w, group_size)
        return Codes(pack_int4(int4_codes(w, scale, zero)), scale, zero)
    raise ValueError(f"unknown format {fmt!r}")


def _stored(scale: Tensor) -> Tensor:
    return scale.clamp_min(1e-6).to(SCALE_DTYPE)


def int4_params(w: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """Min/max (asymmetric) scale (float16) and integer zero point (uint8, 0..15) per group, as
    GPTQ's quantizer chooses them (the range widened to include 0)."""
    groups = w.float().unflatten(1, (-1, group_size))
    low, high = groups.amin(-1).clamp_max(0), groups.amax(-1).clamp_min(0)
    scale = _stored((high - low) / 15)
    zero = (-low / scale.float()).round().clamp(0, 15).to(ZERO_DTYPE)
    return scale, zero


def float_zero(scale: Tensor, zero: Tensor) -> Tensor:
    """The float zero of the kernels' `(q - 8) * scale + float_zero` form, in float32."""
    return scale.float() * (8 - zero.float())


def int4_codes(w: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """(N, K) int32 codes 0..15 of `w` on the grid (scale, zero point), rounded to nearest."""
    group = w.shape[1] // scale.shape[1]
    s = scale.float().repeat_interleave(group, 1)
    z = zero.float().repeat_interleave(group, 1)
    return (w.float() / s + z).round().clamp(0, 15).to(torch.int32)


def pack_int4(codes: Tensor) -> Tensor:
    """(N, K) codes 0..15 -> (N, K/2) uint8, even k in the low nibble."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_int4(packed: Tensor) -> Tensor:
    """(N, K/2) uint8 -> (N, K) int32 codes 0..15."""
    low, high = packed & 0xF, packed >> 4
    return torch.stack([low, high], -1).flatten(1).to(torch.int32)


def dequantize(codes: Codes, fmt: str, dtype: torch.dtype = torch.float32) -> Tensor:
    """The (N, K) weight the codes stand for, in `dtype` (computed in float32)."""
    if fmt in ("int8", "fp8"):
        return (codes.q.float() * codes.scale.float()).to(dtype)
    q = unpack_int4(codes.q).float()
    group = q.shape[1] // codes.scale.shape[1]
    s = codes.scale.float().repeat_interleave(group, 1)
    z = codes.zero.float().repeat_interleave(group, 1)
    return ((q - z) * s).to(dtype)
