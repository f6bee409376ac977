"""`QuantLinear`: an `nn.Linear` whose weight is stored as low-precision codes plus scales.

It is a module called by the family's forward exactly where the `nn.Linear` was, so everything
that works through modules (tensor parallelism's row-parallel all_reduce, capture, the MoE expert
loop) keeps working. The stored tensors are plain (`codes.py`), so a quantized model saves with
safetensors and each tensor-parallel rank holds the codes of its own shard.

Two kernels, the same maths:
  * `torchao`: the codes wrapped, without a copy for int8 and fp8, in torchao's weight tensor
    subclasses (`Int8Tensor`, `Float8Tensor`, and on CPU `Int4OpaqueTensor`, whose matmul is
    `aten._weight_int4pack_mm_for_cpu`) and multiplied with `F.linear`. Built on first use per
    activation dtype and device. One exception: int8 with bfloat16 / float16 activations on CPU
    runs aten's `_weight_int8pack_mm` (gpt-fast's CPU int8 kernel), since torchao's weight-only
    `Int8Tensor` casts the whole weight to the activation dtype at every call there (about 40x
    slower on a 4096 x 4096 layer, `measurements/cpu_2026-11-29_quant`).
  * `dequant`: dequantize to the activation dtype, then `F.linear`. The fallback wherever the
    torchao kernel does not run (int4 off CPU, or shapes its packing refuses).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode.quant.codes import FP8, SCALE_DTYPE, ZERO_DTYPE, Codes, dequantize, quantize_weight

KERNELS = ("torchao", "dequant")
_INT4_KERNEL_GROUPS = (32, 64, 128)           # what Int4OpaqueTensor accepts


def storage_dtypes(fmt: str) -> dict[str, torch.dtype]:
    """Buffer name -> dtype of a format's stored tensors."""
    if fmt == "int8":
        return {"weight_q": torch.int8, "weight_scale": SCALE_DTYPE}
    if fmt == "fp8":
        return {"weight_q": FP8, "weight_scale": SCALE_DTYPE}
    return {"weight_q": torch.uint8, "weight_scale": SCALE_DTYPE,
            "weight_zero": ZERO_DTYPE}


def storage_shapes(fmt: str, out_features: int, in_features: int,
                   group_size: int | None) -> dict[str, tuple[int, ...]]:
    if fmt in ("int8", "fp8"):
        return {"weight_q": (out_features, in_features), "weight_scale": (out_features, 1)}
    groups = in_features // group_size
    return {"weight_q": (out_features, in_features // 2), "weight_scale": (out_features, groups),
            "weight_zero": (out_features, groups)}


class QuantLinear(nn.Module):
    """y = x W^T + b with W held as codes (`codes.py`); then `reduce(y)` when the linear it
    replaced was row-parallel.

    Args:
        fmt: `int8`, `int4` or `fp8`.
        group_size: int4's group (None otherwise).
        reduce: the all_reduce of a row-parallel linear's partial outputs, or None.
        kernel: `torchao` (falls back to `dequant` where torchao's kernel does not run) or
            `dequant`.
    """

    def __init__(self, in_features: int, out_features: int, fmt: str, group_size: int | None,
                 bias: bool, device: Any = None, dtype: torch.dtype | None = None,
                 reduce: Callable[[Tensor], Tensor] | None = None, kernel: str = "torchao"):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")
        self.in_features, self.out_features = in_features, out_features
        self.format, self.group_size, self.kernel = fmt, group_size, kernel
        self.reduce = reduce
        shapes = storage_shapes(fmt, out_features, in_features, group_size)
        for name, dt in storage_dtypes(fmt).items():
            self.register_buffer(name, torch.empty(shapes[name], dtype=dt, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype),
                                 requires_grad=False) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str, group_size: int | None = None,
                    codes: Codes | None = None, kernel: str = "torchao") -> "QuantLinear":
        """Quantize `linear` (round to nearest unless `codes` are given, e.g. by GPTQ)."""
        weight = linear.weight
        new = cls(linear.in_features, linear.out_features, fmt, group_size,
                  linear.bias is not None, device=weight.device, dtype=weight.dtype,
                  reduce=getattr(linear, "reduce", None), kernel=kernel)
        if codes is None:          # a row-parallel shard's row scale spans every rank's columns
            codes = quantize_weight(weight, fmt, group_size, getattr(linear, "row_max", None))
        new.set_codes(codes)
        if linear.bias is not None:
            new.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        return new

    def set_codes(self, codes: Codes) -> None:
        dtypes = storage_dtypes(self.format)
        self.weight_q = codes.q.to(dtypes["weight_q"]).contiguous()
        self.weight_scale = codes.scale.to(dtypes["weight_scale"]).contiguous()
        if codes.zero is not None:
            self.weight_zero = codes.zero.to(dtypes["weight_zero"]).contiguous()
        self.__dict__.pop("_ao", None)

    @classmethod
    def fuse_rows(cls, layers: list["QuantLinear"]) -> "QuantLinear":
        """One layer computing `layers`' outputs side by side (q|k|v, gate|up), each layer's
        codes, scales, zeros and bias rebound as row views of it (no second copy).

        Exact: every format's scales are per output row (and group of inputs), and GPTQ treats
        rows independently given the inputs' Hessian, which layers fed the same input share, so
        the codes of the fused float matrix are these codes stacked. That is why the fusion can
        follow quantization here, where torchao's packed subclasses cannot be concatenated.

        Raises:
            ValueError: layers of different inputs, formats, group sizes or kernels, a bias on
                some only, or a row-parallel layer (its all_reduce is per layer).
        """
        first = layers[0]
        if len(layers) == 1:
            return first
        kinds = {(m.in_features, m.format, m.group_size, m.kernel, m.bias is None, m.reduce is None)
                 for m in layers}
        if len(kinds) > 1 or first.reduce is not None:
            raise ValueError("only column-parallel quantized layers of one input width, format, "
                             "group size, kernel and bias use fuse")
        fused = cls(first.in_features, sum(m.out_features for m in layers), first.format,
                    first.group_size, first.bias is not None, device=first.weight_q.device,
                    kernel=first.kernel)
        names = list(storage_dtypes(first.format)) + (["bias"] if first.bias is not None else [])
        # the new storage is an inference tensor exactly when the old one was (fused inside a
        # forward under torch.inference_mode, the codes must still take a later state load)
        with torch.no_grad(), torch.inference_mode(first.weight_q.is_inference()):
            for name in names:
                whole = torch.cat([getattr(m, name).detach() for m in layers])
                if name == "bias":
                    fused.bias = nn.Parameter(whole, requires_grad=False)
                else:
                    setattr(fused, name, whole)
                start = 0
                for m in layers:
                    end = start + m.out_features
                    if name == "bias":
                        m.bias.data = whole[start:end]
                    else:
                        setattr(m, name, whole[start:end])
                    m.__dict__.pop("_ao", None)
                    start = end
        return fused

    def codes(self) -> Codes:
        return Codes(self.weight_q, self.weight_scale, getattr(self, "weight_zero", None))

    def dequantized(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The (N, K) weight the codes stand for."""
        return dequantize(self.codes(), self.format, dtype)

    @property
    def weight(self) -> Tensor:
        """The dequantized weight (float32), for code that reads `.weight` (shape, dtype)."""
        return self.dequantized()

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        # `.to(dtype)` converts every floating tensor, fp8 codes and bf16 int4 scales included:
        # move with it, then put the stored dtypes back (exact: fp32 holds every e4m3 and bf16)
        out = super()._apply(fn, *args, **kwargs)
        for name, dt in storage_dtypes(self.format).items():
            tensor = getattr(self, name)
            if tensor.dtype != dt:
                setattr(self, name, tensor.to(dt))
        self.__dict__.pop("_ao", None)
        return out

    def torchao_runs(self, device: torch.device) -> bool:
        """Whether the torchao kernel serves this layer's format and shape on `device` (and
        torchao, the `quant` extra, is installed)."""
        from dllm_decode.quant.torchao_bridge import torchao_available

        if not torchao_available():
            return False
        if self.format != "int4":
            return True
        return (device.type == "cpu" and self.group_size in _INT4_KERNEL_GROUPS
                and self.out_features % 16 == 0)

    def _derived_key(self, dtype: torch.dtype, device: torch.device) -> tuple:
        """What a weight derived from the codes (a kernel's packed copy) depends on: the dtype,
        the device and each code tensor's storage and version, so an in-place edit or a state
        load rebuilds it (an inference tensor tracks no version: edited in place under
        `torch.inference_mode`, it is not seen)."""
        return dtype, device, tuple((t.data_ptr(), _version(t)) for t in self.codes() if t is not None)

    def _torchao_weight(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        key = self._derived_key(dtype, device)
        cached = self.__dict__.get("_ao")
        if cached is not None and cached[0] == key:
            return cached[1]
        weight = _wrap(self, dtype)
        self.__dict__["_ao"] = (key, weight)     # derived: not a buffer, not saved
        return weight

    def _int8_pack(self, x: Tensor) -> Tensor:
        if self.weight_q.data_ptr() % 64:
            # codes read from safetensors are views into the file at any 8-byte offset, and the
            # kernel's vector loads fault on them (segfault at 8+ rows): own an aligned copy
            self.weight_q = self.weight_q.clone()
        key = self._derived_key(x.dtype, x.device)
        cached = self.__dict__.get("_ao")
        if cached is None or cached[0] != key:
            cached = (key, self.weight_scale.reshape(-1).to(x.dtype))
            self.__dict__["_ao"] = cached
        flat = x.reshape(-1, self.in_features).contiguous()
        return torch._weight_int8pack_mm(flat, self.weight_q, cached[1]).reshape(
            *x.shape[:-1], self.out_features)

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel == "torchao" and self.format == "int8" and x.device.type == "cpu" \
                and x.dtype in (torch.bfloat16, torch.float16):
            y = self._int8_pack(x)
        elif self.kernel == "torchao" and self.torchao_runs(x.device):
            y = F.linear(x, self._torchao_weight(x.dtype, x.device))
        else:
            y = F.linear(x, self.dequantized(x.dtype))
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y if self.reduce is None else self.reduce(y)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.group_size else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.format}{group}, bias={self.bias is not None}, kernel={self.kernel}")


def _wrap(layer: QuantLinear, dtype: torch.dtype) -> Tensor:
    """The layer's codes as a torchao weight subclass for activations of `dtype`."""
    from dllm_decode.quant.torchao_bridge import float8_tensor, int4_cpu_tensor, int8_tensor

    if layer.format == "int8":
        return int8_tensor(layer.weight_q, layer.weight_scale, dtype)
    if layer.format == "fp8":
        return float8_tensor(layer.weight_q, layer.weight_scale, dtype)
    return int4_cpu_tensor(layer.weight_q, layer.weight_scale, layer.weight_zero,
                           layer.group_size, (layer.out_features, layer.in_features), dtype)


def _version(t: Tensor) -> int:
    try:
        return t._version
    except RuntimeError:                     # an inference tensor
        return -1
