"""Warnings this package gives a user (not a programmer): shown as one `warning:` line.

`Notice` is their base class; `one_line_warnings()` (called by the command line) prints them as
`warning: <message>` instead of Python's file-and-line form. Import-light: no torch.
"""

from __future__ import annotations

import warnings
from typing import Any


class Notice(UserWarning):
    """A warning about the user's input, for a person to read."""


class UnknownWordsWarning(Notice):
    """A prompt holds words the tokenizer maps to its unknown token."""


def one_line_warnings() -> None:
    """Show `Notice` warnings as `warning: <message>` on one line, as a command line should
    (Python's default adds the file, line and source line); others keep Python's format."""
    default = warnings.formatwarning
    if getattr(default, "one_line", False):
        return

    def format_warning(message: Any, category: type[Warning], filename: str, lineno: int,
                       line: str | None = None) -> str:
        if issubclass(category, Notice):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    format_warning.one_line = True             # type: ignore[attr-defined]
    warnings.formatwarning = format_warning    # type: ignore[assignment]
