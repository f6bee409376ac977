"""The one check of a device and a parameter dtype, shared by the CLI (`--device`, `--dtype`)
and the API (`load_model(device=..., dtype=...)`)."""

from __future__ import annotations

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
