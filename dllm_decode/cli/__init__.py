"""`dllm-decode`: the command line. The group's own options decode one prompt; subcommands do the
rest, one module each (`decode` with `batch`, `listing`, `evaluate`, `spec`, `bench`,
`train_filter`, `fetch`, `serve`), with the parsing they share in `options`.

This package is the edge where names become objects. Its modules import only click at load time
(torch, transformers and the registries inside the commands), so `--help` and `--version` answer
at once.
"""

from __future__ import annotations

from typing import Any

import click

from dllm_decode import __version__
from dllm_decode.cli.bench import bench_command
from dllm_decode.cli.decode import decode_options, run_decode
from dllm_decode.cli.evaluate import eval_command
from dllm_decode.cli.fetch import fetch_command
from dllm_decode.cli.freq_table import freq_table_command
from dllm_decode.cli.listing import list_command
from dllm_decode.cli.quantize import quantize_command
from dllm_decode.cli.serve import serve_command
from dllm_decode.cli.spec import spec_command
from dllm_decode.cli.train_filter import train_filter_command
from dllm_decode.cli.tune import tune_command
from dllm_decode.cli.verify import verify_command


class _Main(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        from dllm_decode.outputs import write_errors

        with write_errors():              # a full disk or a special file: one line, exit 1
            return super().invoke(ctx)


@click.group(cls=_Main, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="dllm-decode")
@decode_options
@click.pass_context
def main(ctx: click.Context, **options: Any) -> None:
    """Decode a prompt with a masked diffusion LM (the options below); subcommands for the rest."""
    from dllm_decode.allocator import keep_freed_memory
    from dllm_decode.notices import one_line_warnings

    one_line_warnings()                   # a prompt's unknown words: one `warning:` line on stderr
    keep_freed_memory()                   # reuse activation memory across forwards (allocator.py)
    if ctx.invoked_subcommand is None:
        run_decode(**options)


for _command in (list_command, eval_command, spec_command, bench_command, train_filter_command,
                 fetch_command, serve_command, tune_command, freq_table_command, verify_command,
                 quantize_command):
    main.add_command(_command)
