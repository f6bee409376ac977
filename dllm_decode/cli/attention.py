"""`--attention NAME[:key=value,...]`: the diffusion model's attention back end on decode, eval
and serve (`dllm_decode.models.attention`: `dense`, or `sparsed` for SparseD)."""

from __future__ import annotations

from typing import Any

import click

ATTENTION_HELP = ("The diffusion model's attention back end: dense (default) or sparsed (SparseD: "
                  "dense early steps, then per-head sparse tile patterns chosen once per request; "
                  "bidirectional models, --cache none), with options as sparsed:select=0.5,tile=32 "
                  "(skip, select, tile, steps, scale).")


def attention_option(command: Any) -> Any:
    """`--attention`, checked as a whole at parse (an unknown back end or a bad option is a
    usage error before any model loads)."""
    return click.option("--attention", default=None, metavar="dense|sparsed[:KEY=VALUE,...]",
                        callback=_check, help=ATTENTION_HELP)(command)


def _check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from dllm_decode.models.attention import parse_attention

    try:
        parse_attention(value)
    except (ValueError, TypeError) as err:
        raise click.BadParameter(str(err).splitlines()[0], param_hint="--attention") from None
    return value
