"""`dllm-decode list`: every registry entry with its fields and defaults."""

from __future__ import annotations

import click

KINDS = (("schedulers", "scheduler"), ("caches", "cache"), ("filters", "filter"),
         ("AR draft-length rules (spec --scheduler, beside the schedulers)", "draft_length"),
         ("drafters (spec --draft NAME -d KEY=VALUE)", "drafter"),
         ("self-speculative decoders (--self-decoder NAME -s KEY=VALUE)", "self_decoder"))


@click.command("list")
def list_command() -> None:
    """Print every scheduler, cache, filter, drafter and self-decoder with each one's fields and defaults."""
    from dllm_decode.registry import describe, registry
    from dllm_decode.speculative.drafters import draft_help

    for title, kind in KINDS:
        click.echo(f"{title}:")
        for name, doc, params in describe(registry(kind)):
            click.echo(f"  {name:<16} {doc}")
            for field_name, type_name, default in params:
                click.echo(f"      {field_name} ({type_name}) = {default!r}")
    click.echo(f"short --draft spellings: {draft_help()}")
