"""The canvas animated in a terminal with `rich` (`dllm-decode --show`), or one plain line a step
when the output is not a terminal (a pipe, a log file).

Cells: committed tokens in green (bold and reversed on the step that commits them), provisional
predictions of still-masked positions dim yellow, masked positions `░`, a noise canvas's
uncommitted positions magenta, and a position a step took back or edited red and underlined.
The plain form writes the same cells as text: `tok` committed, `?tok` provisional, `_` masked,
`~tok` noise, with a leading `!` on a position the step revised.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from dllm_decode.viz.frames import Frame, SampleTrace

MASK_CELL = "░"
RICH_MISSING = "--show needs the 'rich' package: pip install 'dllm-decode[viz]'"


def plain_cell(frame: Frame, p: int, labels: dict[int, str]) -> str:
    """Position `p` of `frame` as plain text (see the module doc)."""
    state, tok = frame.state[p], frame.tokens[p]
    text = {"committed": lambda: labels[tok], "provisional": lambda: "?" + labels[tok],
            "noise": lambda: "~" + (labels[tok] if tok is not None else ""),
            "masked": lambda: "_"}[state]()
    return ("!" if p in frame.revised else "") + text


def headline(sample: SampleTrace, frame: Frame, index: int, count: int) -> str:
    """`sample i/n  step s/S  +k tokens  confidence c`: where the decode is and what it just did."""
    conf = [frame.confidence[p] for p in frame.committed if frame.confidence[p] is not None]
    mean = f"  mean confidence {sum(conf) / len(conf):.2f}" if conf else ""
    revised = f"  {len(frame.revised)} revised" if frame.revised else ""
    who = f"sample {index + 1}/{count}  " if count > 1 else ""
    return f"{who}step {frame.step}/{sample.steps}  +{len(frame.committed)} tokens{revised}{mean}"


def plain_lines(samples: list[SampleTrace], labels: dict[int, str]) -> list[str]:
    """Every step of every sample as one line: the headline, then the cells."""
    lines = []
    for index, sample in enumerate(samples):
        for frame in sample.frames:
            cells = " ".join(plain_cell(frame, p, labels) for p in range(len(frame.tokens)))
            lines.append(f"{headline(sample, frame, index, len(samples))} | {cells}")
        lines.append(summary(sample, index, len(samples)))
    return lines


def summary(sample: SampleTrace, index: int, count: int) -> str:
    """The sample's totals: steps, tokens per step, revisions."""
    width = len(sample.final)
    who = f"sample {index + 1}/{count}: " if count > 1 else ""
    revisions = sum(sample.revisions)
    return (f"{who}{sample.steps} steps, {width / max(sample.steps, 1):.2f} tokens per step"
            + (f", {revisions} revisions" if revisions else ""))


def rich_frame(sample: SampleTrace, frame: Frame, labels: dict[int, str], index: int, count: int) -> Any:
    """One frame as a `rich` renderable: the headline and the coloured cells."""
    from rich.text import Text

    text = Text(headline(sample, frame, index, count) + "\n", style="bold")
    fresh = set(frame.committed)
    for p, (state, tok) in enumerate(zip(frame.state, frame.tokens)):
        if state == "committed":
            cell, style = labels[tok], "bold reverse green" if p in fresh else "green"
        elif state == "provisional":
            cell, style = labels[tok], "dim italic yellow"
        elif state == "noise":
            cell, style = labels[tok] if tok is not None else "~", "magenta"
        else:
            cell, style = MASK_CELL, "grey50"
        if p in frame.revised:
            style = "bold underline red"
        text.append(cell, style=style)
        text.append(" ")
    return text


def show(samples: list[SampleTrace], labels: dict[int, str], out: TextIO | None = None,
         delay: float = 0.15, force_terminal: bool | None = None) -> None:
    """Animate `samples` (all at once, one frame a step) on `out` (stdout), or write
    `plain_lines` when it is not a terminal.

    Raises:
        click.ClickException: `rich` is not installed (it is the `viz` extra).
    """
    out = out or sys.stdout
    terminal = force_terminal if force_terminal is not None else out.isatty()
    if not terminal:
        out.write("\n".join(plain_lines(samples, labels)) + "\n")
        out.flush()
        return
    try:
        from rich.console import Console, Group
        from rich.live import Live
    except ImportError:
        import click

        raise click.ClickException(RICH_MISSING) from None
    console = Console(file=out, force_terminal=True)
    steps = max((s.steps for s in samples), default=0)
    with Live(console=console, auto_refresh=False, transient=False) as live:
        for k in range(steps):
            parts = [rich_frame(s, s.frames[min(k, s.steps - 1)], labels, i, len(samples))
                     for i, s in enumerate(samples) if s.frames]
            live.update(Group(*parts), refresh=True)
            time.sleep(delay)
    for i, sample in enumerate(samples):
        console.print(summary(sample, i, len(samples)), style="dim")
