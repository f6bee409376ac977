"""`dllm-decode bench`: speed and quality side by side, as ratios measured in one run."""

from __future__ import annotations

import dataclasses
import json

import click


@click.command("bench")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the full report here.")
@click.option("--quick", is_flag=True, help="A seconds-long configuration (gen 16, block 8, one repeat).")
@click.option("--model", "model_name", default="embedded", show_default=True,
              help="`embedded` (tiny_llada when not installed), `tiny`, or a model directory.")
@click.option("--repeats", type=click.IntRange(1), default=None, help="Interleaved repeats [3; quick 1].")
@click.option("--per-task", type=click.IntRange(1), default=None, help="Test examples per task [8; quick 1].")
@click.option("--gen-length", type=click.IntRange(1), default=None, help="Canvas length [256; quick 16].")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
              help="torch intra-op threads (1: stable on a shared machine).")
@click.option("--section", "sections", multiple=True,
              type=click.Choice(["loop", "stack", "gap", "ar", "compile"]),
              help="Run only these sections (the scheduler table always runs); repeatable "
                   "[all but compile].")
def bench_command(json_path: str | None, quick: bool, model_name: str, repeats: int | None,
                  per_task: int | None, gen_length: int | None, threads: int,
                  sections: tuple[str, ...]) -> None:
    """Benchmark speed and quality side by side (ratios, one run): loop overhead, tokens/s by
    batch size, every scheduler vs one token per step and the oracle, cache/filter speedups,
    AR + speculative vs AR."""
    from dllm_decode.cli.options import usage_errors, writable_file
    from dllm_decode.config import DecodeConfig
    from dllm_decode.eval.bench.suite import QUICK, Options, _warmup, format_report, run

    if json_path:
        writable_file(json_path, "--json")
    options = QUICK if quick else Options()
    changes = {k: v for k, v in (("repeats", repeats), ("per_task", per_task), ("gen", gen_length))
               if v is not None}
    with usage_errors():
        options = dataclasses.replace(options, **changes)
        DecodeConfig(scheduler=_warmup(), gen_length=options.gen, block_length=options.block)
    report = run(model_name, options, threads, sections or ("loop", "stack", "gap", "ar"),
                 progress=lambda line: click.echo(line, err=True))
    click.echo(format_report(report))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1, default=str)
