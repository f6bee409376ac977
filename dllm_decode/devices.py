"""The one check of a device and a parameter dtype, shared by the CLI (`--device`, `--dtype`)
and the API (`load_model(device=..., dtype=...)`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Parameter dtypes a model may be loaded in, by name."""


def check_device(value: Any) -> torch.device:
    """A device this machine has: `None` (the CPU), a `torch.device`, or its name.

    Raises:
        TypeError: not a device or a device name.
        ValueError: not a torch device name, or one this torch build or machine lacks.
    """
    if value is None:
        return torch.device("cpu")
    if isinstance(value, bool) or not isinstance(value, (str, torch.device)):
        raise TypeError(f"device must be a torch.device or a name such as 'cpu' or 'cuda:0', got "
                        f"{type(value).__name__} {value!r}")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{value!r} is not a torch device; use cpu, cuda, cuda:N or mps") from None
    available = {"cpu": True, "cuda": torch.cuda.is_available(),
                 "mps": getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()}
    if not available.get(device.type, False):
        raise ValueError(f"device {str(value)!r} is not available on this machine (torch "
                         f"{torch.__version__}); use cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {str(value)!r}: this machine has {torch.cuda.device_count()} "
                         f"CUDA device(s)")
    return device


def check_dtype(value: Any) -> torch.dtype | None:
    """A floating parameter dtype (`None`: the model's default), given as a `torch.dtype` or a
    name in `DTYPES`.

    Raises:
        ValueError: a name not in `DTYPES`, or a non-floating dtype.
        TypeError: neither a dtype nor a name.
    """
    if value is None:
        return None
    if isinstance(value, str):
        if value not in DTYPES:
            raise ValueError(f"dtype {value!r} is not accepted; choose from {sorted(DTYPES)}")
        return DTYPES[value]
    if not isinstance(value, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype or one of {sorted(DTYPES)}, got "
                        f"{type(value).__name__} {value!r}")
    if not value.is_floating_point:
        raise ValueError(f"dtype {value} is not a floating dtype; choose from {sorted(DTYPES)}")
    if torch.finfo(value).bits < 16:       # float8: a storage format, no matmul computes in it
        raise ValueError(f"dtype {value} is a storage format, not a compute dtype; choose from "
                         f"{sorted(DTYPES)} (float8 checkpoints load into these)")
    return value


def device_name(device: torch.device) -> str:
    """A report's name for `device`: the GPU's model name on CUDA, else the device type."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def device_sync(device: torch.device) -> Callable[[], None] | None:
    """What waits for `device`'s queued work (CUDA), or None where work is synchronous; timers
    call it around what they time."""
    return torch.cuda.synchronize if device.type == "cuda" else None


def device_of(model: Any) -> torch.device:
    """The device a model computes on: its first parameter's, else its `device` attribute, else
    the CPU."""
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return torch.device(getattr(model, "device", "cpu"))


@dataclass(frozen=True)
class DevicePeaks:
    """A device's datasheet peaks: memory bandwidth (bytes/s) and dense FLOP/s per dtype.

    Dense means without 2:4 structured sparsity (datasheets often print the sparse figure, twice
    the dense one). `fp32` is the non-tensor-core FP32 rate. `source` says where the numbers come
    from; they are vendor figures, not measurements: a device reaches perhaps 80-90% of them.
    """

    name: str
    hbm_bytes_per_s: float
    flops: dict[str, float]
    source: str

    def flops_for(self, dtype: str) -> float | None:
        """Dense FLOP/s for a dtype name (`bfloat16`, `float16`, `float32` or the short names)."""
        short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)
        return self.flops.get(short)


def _peaks(name: str, tb_per_s: float, bf16: float, fp16: float, fp32: float, source: str) -> DevicePeaks:
    return DevicePeaks(name, tb_per_s * 1e12, {"bf16": bf16 * 1e12, "fp16": fp16 * 1e12, "fp32": fp32 * 1e12},
                       source)


DEVICE_PEAKS: dict[str, DevicePeaks] = {
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): SXM 3.35 TB/s HBM3, BF16/FP16
    # tensor 1,979 TFLOPS with sparsity (989.4 dense), FP32 67 TFLOPS; PCIe 2.0 TB/s, 1,513 sparse
    # (756 dense), FP32 51; NVL 3.9 TB/s, 1,671 sparse (835 dense), FP32 60.
    "H100 SXM": _peaks("H100 SXM", 3.35, 989.4, 989.4, 67.0, "NVIDIA H100 datasheet (SXM5 80GB)"),
    "H100 PCIe": _peaks("H100 PCIe", 2.0, 756.0, 756.0, 51.0, "NVIDIA H100 datasheet (PCIe 80GB)"),
    "H100 NVL": _peaks("H100 NVL", 3.9, 835.0, 835.0, 60.0, "NVIDIA H100 datasheet (NVL 94GB)"),
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): 4.8 TB/s HBM3e, the H100 SXM's
    # compute (1,979 sparse / 989 dense BF16, FP32 67).
    "H200": _peaks("H200", 4.8, 989.4, 989.4, 67.0, "NVIDIA H200 datasheet (SXM 141GB)"),
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): BF16/FP16 tensor 312 TFLOPS dense,
    # FP32 19.5; 40GB 1,555 GB/s; 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s.
    "A100 40GB": _peaks("A100 40GB", 1.555, 312.0, 312.0, 19.5, "NVIDIA A100 datasheet (40GB)"),
    "A100 80GB SXM": _peaks("A100 80GB SXM", 2.039, 312.0, 312.0, 19.5, "NVIDIA A100 datasheet (80GB SXM)"),
    "A100 80GB PCIe": _peaks("A100 80GB PCIe", 1.935, 312.0, 312.0, 19.5, "NVIDIA A100 datasheet (80GB PCIe)"),
    # NVIDIA L40S datasheet: 864 GB/s GDDR6, BF16/FP16 tensor 733 TFLOPS sparse (362 dense), FP32 91.6.
    "L40S": _peaks("L40S", 0.864, 362.05, 362.05, 91.6, "NVIDIA L40S datasheet"),
    # NVIDIA Ada (AD102) architecture whitepaper, GeForce RTX 4090: 1,008 GB/s GDDR6X, FP16/BF16
    # tensor with FP32 accumulate 165.2 TFLOPS dense (what torch's bf16 GEMMs use), FP32 82.6.
    "RTX 4090": _peaks("RTX 4090", 1.008, 165.2, 165.2, 82.6, "NVIDIA Ada Lovelace whitepaper (RTX 4090)"),
    # AMD Instinct MI300X data sheet: 5.3 TB/s HBM3, FP16/BF16 matrix 1,307.4 TFLOPS dense, FP32
    # vector 163.4 (FP64 vector 81.7).
    "MI300X": _peaks("MI300X", 5.3, 1307.4, 1307.4, 163.4, "AMD Instinct MI300X data sheet"),
}
"""Datasheet peaks by device; `device_peaks` finds the entry for a reported device name."""

_NAME_PATTERNS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("h100", "pcie"), "H100 PCIe"), (("h100", "nvl"), "H100 NVL"), (("h100", "sxm"), "H100 SXM"),
    (("h100", "hbm3"), "H100 SXM"),       # torch reports the SXM part as "NVIDIA H100 80GB HBM3"
    (("h200",), "H200"),
    (("a100", "40gb"), "A100 40GB"), (("a100", "80gb", "pcie"), "A100 80GB PCIe"),
    (("a100", "80gb"), "A100 80GB SXM"),
    (("l40s",), "L40S"), (("rtx 4090",), "RTX 4090"), (("mi300x",), "MI300X"),
)


def device_peaks(name: str) -> DevicePeaks | None:
    """The `DEVICE_PEAKS` entry for a device name as torch reports it (`NVIDIA H100 80GB HBM3`,
    `NVIDIA A100-SXM4-40GB`, `AMD Instinct MI300X`), or None for a device not listed (a CPU, or a
    variant whose bandwidth the name does not settle: no guessing)."""
    lowered = name.lower().replace("-", " ")
    for needles, key in _NAME_PATTERNS:
        if all(n in lowered for n in needles):
            return DEVICE_PEAKS[key]
    return None
