"""What `dllm-decode --show` and `--trace-html FILE` do with a decode traced for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True)
class Views:
    """The views the command line asked for: the terminal animation, an HTML file, or both."""

    show: bool
    trace_html: str | None

    @classmethod
    def checked(cls, show: bool, trace_html: str | None) -> Views:
        """The request, with the HTML path refused before any work (a folder, a device) and the
        terminal library present when the animation needs it."""
        from dllm_decode.outputs import OutputError, check_output

        if trace_html is not None:
            try:
                check_output(trace_html, "HTML trace")
            except OutputError as err:
                raise click.BadParameter(str(err), param_hint="--trace-html") from None
        if show and _interactive():
            try:
                import rich  # noqa: F401
            except ImportError:
                from dllm_decode.viz.terminal import RICH_MISSING

                raise click.ClickException(RICH_MISSING) from None
        return cls(show, trace_html)

    def present(self, result: Any, tokenizer: Any, prompt: str | None) -> None:
        """Write the HTML file, then animate (and print the answer after the animation)."""
        from dllm_decode.outputs import write_errors
        from dllm_decode.viz.frames import result_frames, token_labels, used_ids

        samples = result_frames(result)
        labels = token_labels(tokenizer, used_ids(samples))
        if self.trace_html is not None:
            from dllm_decode.viz.html import render_html, trace_data
            from dllm_decode.outputs import atomic_write

            with write_errors():
                atomic_write(self.trace_html, render_html(trace_data(samples, labels, result.text,
                                                                     [prompt or ""])), "HTML trace")
        if self.show:
            from dllm_decode.viz.terminal import show

            show(samples, labels)
            answer = result.text[0] if result.text is not None else " ".join(map(str, result.tokens[0].tolist()))
            click.echo(answer)


def _interactive() -> bool:
    import sys

    return sys.stdout.isatty()
