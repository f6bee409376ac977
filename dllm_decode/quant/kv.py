"""A low-precision KV cache: keys and values stored as int8 or FP8 e4m3 codes with one float32
scale per head per canvas column, behind the `KVCache` / `StaticKVCache` contract.

A model carries its store (`set_kv_cache_dtype(model, "fp8")`, or `load_model(kv_cache_dtype=)`
and `--kv-cache-dtype` on the CLI, named as vLLM names it); the caches that keep K/V through that
contract (prefix, dual, block, suffix, and the captured step's static store) make their state
with it, so no family's forward knows the format; a family with its own cache that reads the
store (`supports_kv_store`: DiffusionGemma's encoder cache) keeps its K/V the same way. Each written (row, head, column) vector of D
values gets its own scale, absmax / qmax (qmax 127 for int8, 448 for e4m3): the cache of a
diffusion decode is rewritten in place column by column (the dual cache's active block every
step), so a scale shared by many columns would have to be recomputed over columns already
stored, and a static per-layer scale (vLLM's `k_scale`) would clip the columns written after it
was chosen. A read dequantizes the whole layer to the dtype written (one layer at a time, so the
float copy is transient): storage shrinks to (D + 4) / (2 D) of bf16 (0.52x at D = 128), the
attention kernel still runs in float. Every forward, a refresh included, attends the K/V as stored
(dequantized, its own fresh columns too), so the eager and the captured step read the same values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

KV_CACHE_DTYPES = ("auto", "fp8", "int8")
"""`auto`: K/V stored in the model's dtype; `fp8`: e4m3 codes; `int8`: int8 codes (both with a
float32 scale per head per column)."""

_CODES = {"int8": (torch.int8, 127.0), "fp8": (torch.float8_e4m3fn, 448.0)}
_TINY = torch.finfo(torch.float32).tiny

SCALE_BYTES = 4
"""Bytes of one float32 scale: a packed static row is D code bytes then its scale's 4 bytes."""

_PACKED = {torch.int8: "int8", torch.uint8: "fp8"}
"""The byte dtype of a packed static store -> its codes (e4m3 codes are kept as their uint8 bit
pattern: CPU `index_copy_` has no float8 kernel)."""


def quantize_as(name: str, x: Tensor) -> tuple[Tensor, Tensor]:
    """(codes, float32 scales) of x's last dimension in format `name`: scale = absmax / qmax per
    vector, codes = x / scale rounded (int8) or cast (e4m3, round to nearest even)."""
    code_dtype, qmax = _CODES[name]
    x = x.float()
    scales = (x.abs().amax(-1, keepdim=True) / qmax).clamp_min(_TINY)
    scaled = (x / scales).clamp(-qmax, qmax)
    codes = scaled.round().to(code_dtype) if code_dtype == torch.int8 else scaled.to(code_dtype)
    return codes, scales


def dequantize(codes: Tensor, scales: Tensor, dtype: torch.dtype) -> Tensor:
    return (codes.float() * scales).to(dtype)


def is_packed(t: Tensor) -> bool:
    """Whether `t` is a packed static store (bytes), not float K/V."""
    return t.dtype in _PACKED


def pack(x: Tensor, storage: torch.dtype) -> Tensor:
    """(..., D) float K/V -> (..., D + 4) bytes of `storage` (a `_PACKED` dtype): codes, then the
    float32 scale's bytes."""
    codes, scales = quantize_as(_PACKED[storage], x)
    return torch.cat([codes.view(storage), scales.view(storage)], -1)


def unpack(t: Tensor, dtype: torch.dtype) -> Tensor:
    """(..., D + 4) packed bytes -> (..., D) K/V of `dtype`."""
    width = t.shape[-1] - SCALE_BYTES
    codes = t[..., :width].view(_CODES[_PACKED[t.dtype]][0])
    return dequantize(codes, t[..., width:].view(torch.float32), dtype)


class KVCacheDtypeError(ValueError):
    """A `kv_cache_dtype` this package does not know, or a model that stores no K/V (one line)."""


class QuantizedKV(NamedTuple):
    """One layer's keys or values: (..., L, D) codes, (..., L, 1) float32 scales and the dtype a
    read gives back."""

    codes: Tensor
    scales: Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes


@dataclass(frozen=True)
class KVQuantStore:
    """How a `KVCache` keeps each layer's K/V: as `QuantizedKV` codes of `dtype`.

    The float store (`layers.FLOAT_STORE`) has the same methods on plain tensors.
    """

    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in _CODES:
            raise KVCacheDtypeError(f"a quantized KV store is one of {list(_CODES)}, got {self.dtype!r}")

    def quantize(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return quantize_as(self.dtype, x)

    def put(self, x: Tensor) -> QuantizedKV:
        codes, scales = self.quantize(x)
        return QuantizedKV(codes, scales, x.dtype)

    def read(self, t: QuantizedKV) -> Tensor:
        return dequantize(t.codes, t.scales, t.dtype)

    def write(self, t: QuantizedKV, rows: tuple[int, int], x: Tensor, keep: Tensor | None = None) -> None:
        """Columns `rows` become the codes of `x`, except where `keep` (B, 1, n, 1) is True
        (the stored codes stay: never quantized twice)."""
        codes, scales = self.quantize(x)
        columns = slice(rows[0], rows[1])
        if keep is not None:
            codes = torch.where(keep, t.codes[:, :, columns], codes)
            scales = torch.where(keep, t.scales[:, :, columns], scales)
        t.codes[:, :, columns] = codes
        t.scales[:, :, columns] = scales

    def select(self, t: QuantizedKV, rows: Tensor) -> QuantizedKV:
        return QuantizedKV(t.codes.index_select(0, rows), t.scales.index_select(0, rows), t.dtype)

    def pad(self, t: QuantizedKV, width: int) -> QuantizedKV:
        def grow(x: Tensor) -> Tensor:
            return torch.cat([x, x.new_zeros(*x.shape[:2], width - x.shape[2], x.shape[3])], 2)

        return QuantizedKV(grow(t.codes), grow(t.scales), t.dtype)

    def trim(self, t: QuantizedKV, width: int) -> QuantizedKV:
        return QuantizedKV(t.codes[:, :, :width], t.scales[:, :, :width], t.dtype)

    def cat(self, a: QuantizedKV, b: QuantizedKV) -> QuantizedKV:
        """Columns of `a` then of `b` (an encoder cache growing by a chunk: its stored codes are
        kept, never quantized again)."""
        return QuantizedKV(torch.cat([a.codes, b.codes], 2), torch.cat([a.scales, b.scales], 2), a.dtype)

    def last(self, t: QuantizedKV, width: int) -> QuantizedKV:
        """The last `width` columns (none when 0), as a sliding window keeps them."""
        start = t.codes.shape[2] - width
        return QuantizedKV(t.codes[:, :, start:], t.scales[:, :, start:], t.dtype)

    def static_layout(self, head_dim: int) -> tuple[int, torch.dtype]:
        """(width, dtype) of a packed static store's rows for heads of `head_dim`: one tensor per
        K and per V, so the captured step's signature and row copies stay those of float K/V."""
        if head_dim % SCALE_BYTES:
            raise KVCacheDtypeError(f"a captured {self.dtype} KV cache packs each head's scale "
                                    f"after its codes and needs head_dim divisible by "
                                    f"{SCALE_BYTES}, got {head_dim}")
        storage = next(d for d, name in _PACKED.items() if name == self.dtype)
        return head_dim + SCALE_BYTES, storage


def kv_store_of(value: Any) -> KVQuantStore | None:
    """`auto` or None -> None (float K/V); `fp8` / `int8` -> its store. One-line error otherwise."""
    if value is None or isinstance(value, KVQuantStore):
        return value
    if not isinstance(value, str) or value not in KV_CACHE_DTYPES:
        raise KVCacheDtypeError(f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, got {value!r}")
    return None if value == "auto" else KVQuantStore(value)


def set_kv_cache_dtype(model: Any, value: Any) -> Any:
    """Store `model`'s K/V as `value` (`auto`, `fp8`, `int8`) in every cache that keeps them
    through `KVCache`; returns the model.

    Raises:
        KVCacheDtypeError: an unknown value, or fp8/int8 for a model without a KV cache
            (`supports_kv` and `supports_kv_store` missing or False; the second marks a family
            whose own cache reads `model.kv_store`, such as DiffusionGemma's encoder cache).
    """
    store = kv_store_of(value)
    keeps_kv = getattr(model, "supports_kv", False) or getattr(model, "supports_kv_store", False)
    if store is not None and not keeps_kv:
        name = getattr(model, "name_or_path", None) or type(model).__name__
        raise KVCacheDtypeError(f"kv_cache_dtype {store.dtype} needs a model with a KV cache, and "
                                f"{name} has none (supports_kv is False)")
    model.kv_store = store
    return model


def kv_cache_dtype(model: Any) -> str:
    """The model's `kv_cache_dtype`: `auto`, `fp8` or `int8`."""
    store = getattr(model, "kv_store", None)
    return "auto" if store is None else store.dtype
