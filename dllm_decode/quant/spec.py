"""What to quantize to: a format name and its group size, checked as a whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

FORMATS = ("int8", "int4", "fp8")
"""Weight-only formats: int8 per output channel, int4 group-wise (asymmetric), FP8 e4m3 per
output channel."""

DEFAULT_GROUP_SIZE = 128


class QuantError(ValueError):
    """A quantization request or checkpoint this package cannot serve (one line)."""


@dataclass(frozen=True)
class QuantSpec:
    """A weight-only quantization request.

    Attributes:
        format: one of `FORMATS`.
        group_size: int4's group along the input dimension (a positive integer dividing every
            layer's input width; default 128; torchao's CPU kernel takes 32, 64 and 128, other
            sizes run the dequantize fallback); int8 and fp8 are per output channel and take none.
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
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) \
                or self.group_size < 1:
            raise QuantError(f"int4 group_size must be a positive integer, got {self.group_size!r}")

    @classmethod
    def parse(cls, text: str) -> "QuantSpec":
        """`int8`, `fp8`, `int4` or `int4:GROUP` (the CLI's `--quantize`)."""
        name, sep, group = str(text).strip().partition(":")
        if not sep:
            return cls(name)
        try:
            size = int(group)
        except ValueError:
            raise QuantError(f"--quantize {text!r}: the group size after ':' must be an integer "
                             f"(e.g. int4:64)") from None
        return cls(name, size)

    def __str__(self) -> str:
        return self.format if self.format != "int4" else f"int4:{self.group_size}"

    @classmethod
    def of(cls, value: Any, group_size: int | None = None) -> "QuantSpec | None":
        """None, a `QuantSpec`, or a format name (`int4:64`, or `int4` with `group_size`)."""
        if value is None or isinstance(value, QuantSpec):
            return value
        if not isinstance(value, str):
            raise QuantError(f"quantize must be one of {list(FORMATS)} or None, got "
                             f"{type(value).__name__} {value!r}")
        return cls(value, group_size) if group_size is not None else cls.parse(value)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format}
        if self.group_size is not None:
            out["group_size"] = self.group_size
        return out


class CheckpointQuantization(NamedTuple):
    """How a checkpoint's quantized tensors become `QuantLinear` states.

    Attributes:
        spec: the format the layers load as.
        convert: the checkpoint's state dict -> (state in the own layout, paths of the layers
            that hold codes; the other linear layers stay float).
    """

    spec: QuantSpec
    convert: Callable[[dict[str, Any]], tuple[dict[str, Any], set[str]]]
