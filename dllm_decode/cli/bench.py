"""`dllm-decode bench`: one subcommand per benchmark record (`dllm_decode.eval.bench.benchmarks`).

A record declares its options as plain data (`dllm_decode.eval.bench.protocol`); this module turns
them into click options, adds `--quick` and `--json` to each, and runs the record: the settings
given over its quick ones when `--quick` is set, progress on standard error, `format(report)` on
standard output, the report as JSON. Every timing goes through one interleaved-repeats helper
(`dllm_decode.eval.bench.timing`); reports give figures and ratios, never pass/fail verdicts.
"""

from __future__ import annotations

import json
from typing import Any

import click

from dllm_decode.cli.options import FloatRange, RegistryHelp, registry_names, writable_file
from dllm_decode.eval.bench.benchmarks import BENCHMARKS
from dllm_decode.eval.bench.protocol import Benchmark, Option, OptionError


def _json_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Checked while parsing, so a bad path fails before any work."""
    if value is not None:
        writable_file(value, "--json")
    return value


def common() -> list[click.Option]:
    """The options every benchmark takes besides its declared ones."""
    return [click.Option(["--json", "json_path"], type=click.Path(dir_okay=False), default=None,
                         callback=_json_path, help="Also write the full report here (checked first)."),
            click.Option(["--quick"], is_flag=True, help="A seconds-long configuration (smoke test).")]


def click_type(option: Option) -> Any:
    if isinstance(option.kind, tuple):
        return click.Choice(option.kind)
    if option.kind is int:
        return click.IntRange(option.low, option.high)
    if option.kind is float:
        return FloatRange(option.low, option.high, min_open=option.low_open)
    return click.STRING


def click_option(option: Option) -> click.Option:
    """The click form of a declared option (a `bool` is a flag, or a switch when named `--x/--no-x`)."""
    names = [*option.flags, option.dest]
    shown = option.default is not None
    if option.kind is bool:
        flag = "/" not in option.flags[0]
        return click.Option(names, is_flag=flag or None, default=False if flag else option.default,
                            help=option.help)
    if option.registry:
        return RegistryHelp(names, type=click_type(option), multiple=option.multiple,
                            default=option.default, show_default=shown, metavar=option.metavar,
                            help=lambda: f"{option.help} Names: {registry_names(option.registry)}.")
    return click.Option(names, type=click_type(option), multiple=option.multiple, help=option.help,
                        default=option.default, show_default=shown, metavar=option.metavar)


def given(values: dict[str, Any]) -> dict[str, Any]:
    """The options set (None and () mean: not given, the benchmark's default)."""
    return {k: v for k, v in values.items() if v is not None and v != ()}


def _say(line: str) -> None:
    click.echo(line, err=True)


def command(bench: Benchmark) -> click.Command:
    def run(json_path: str | None, quick: bool, **values: Any) -> None:
        from dllm_decode.errors import NonFiniteLogits

        settings = {**(bench.quick if quick else {}), **given(values)}
        try:
            report = bench.run(settings, _say)
        except OptionError as err:
            if err.flag:
                raise click.BadParameter(str(err), param_hint=err.flag) from None
            raise click.UsageError(str(err)) from None
        except NonFiniteLogits as err:                    # a model problem: exit 1, one line
            raise click.ClickException(str(err)) from None
        if report is None:                                # a distributed run's other ranks
            return
        click.echo(bench.format(report))
        if json_path:                                     # whole or not at all (outputs.py)
            from dllm_decode.outputs import atomic_write

            atomic_write(json_path, json.dumps(report, indent=1, default=str), "benchmark report")

    return click.Command(bench.name, callback=run, help=bench.help, epilog=bench.defaults,
                         params=[*map(click_option, bench.options), *common()],
                         context_settings={"help_option_names": ["-h", "--help"]})


@click.group("bench", context_settings={"help_option_names": ["-h", "--help"]})
def bench_command() -> None:
    """Benchmark speed and quality side by side: ratios of medians over interleaved repeats,
    measured in one run. `all` is the suite (schedulers, stack, loop, gap, ar); every benchmark
    takes `--quick` (seconds, a smoke test) and `--json FILE`."""


for _bench in BENCHMARKS.values():
    bench_command.add_command(command(_bench))
