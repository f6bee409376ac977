"""Numbers on the command line are written in ASCII digits.

Python's `int()` and `float()` read every Unicode decimal digit (`int("３２")` is 32,
`float("٠.٥")` is 0.5), so click's number types would too. One check in click's shared number
conversion covers every numeric option of every command (`--gen-length`, `--seed`,
`--temperature`, `--calibration`, ...), including ones added later."""

from __future__ import annotations

from typing import Any

import click


def ascii_numbers() -> None:
    """Make click's number types (INT, FLOAT, IntRange, FloatRange) refuse non-ASCII text."""
    base = getattr(click.types, "_NumberParamTypeBase", None)
    if base is None or getattr(base.convert, "ascii_only", False):
        return
    convert = base.convert

    def ascii_convert(self: Any, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not value.isascii():
            self.fail(f"{value!r} is not a number in ASCII digits (0-9)", param, ctx)
        return convert(self, value, param, ctx)

    ascii_convert.ascii_only = True  # type: ignore[attr-defined]
    base.convert = ascii_convert
