"""What to quantize to: a format name and its group size, checked as a whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FORMATS = ("int8", "int4", "fp8")
"""Weight-only formats: int8 per output channel, int4 group-wise (asymmetric), FP8 e4m3 per
output channel."""

INT4_GROUP_SIZES = (16, 32, 64, 128, 256)
DEFAULT_GROUP_SIZE = 128


class QuantError(ValueError):
    """A quantization request or checkpoint this package cannot serve (one line)."""


@dataclass(frozen=True)
class QuantSpec:
    """A weight-only quantization request.

    Attributes:
        format: one of `FORMATS`.
        group_size: int4's group along the input dimension (one of `INT4_GROUP_SIZES`; default
            128); int8 and fp8 are per output channel and take none.
    """

    format: str
    group_size: int | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise QuantError(f"quantize must be one of {list(FORMATS)}, got {self.format!r}")
        if self.format != "int4":
            if self.group_size is not None:
                raise QuantError(f"group_size applies to int4 only; {self.format} is per "
                                 f"output channel")
            return
        if self.group_size is None:
            object.__setattr__(self, "group_size", DEFAULT_GROUP_SIZE)
        if isinstance(self.group_size, bool) or self.group_size not in INT4_GROUP_SIZES:
            raise QuantError(f"int4 group_size must be one of {list(INT4_GROUP_SIZES)}, got "
                             f"{self.group_size!r}")

    @classmethod
    def of(cls, value: Any, group_size: int | None = None) -> "QuantSpec | None":
        """None, a `QuantSpec` or a format name (with `group_size`) -> a spec or None."""
        if value is None or isinstance(value, QuantSpec):
            return value
        if not isinstance(value, str):
            raise QuantError(f"quantize must be one of {list(FORMATS)} or None, got "
                             f"{type(value).__name__} {value!r}")
        return cls(value, group_size)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format}
        if self.group_size is not None:
            out["group_size"] = self.group_size
        return out
