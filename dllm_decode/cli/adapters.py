"""`--adapter [NAME=]DIR`: PEFT LoRA adapters on decode, eval and serve (`dllm_decode.adapters`).
`DIR` alone is merged into the weights at load; `NAME=DIR` (serve only) is kept unmerged and
chosen per request by the model name `MODEL:NAME`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import click

ADAPTER_HELP = ("A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors), merged into "
                "the weights at load; repeatable (applied in order). serve also takes NAME=DIR: kept unmerged, "
                "requests choose it by the model name MODEL:NAME and share batches with other adapters.")


def adapter_option(command: Any) -> Any:
    return click.option("--adapter", "adapter", multiple=True, metavar="[NAME=]DIR", help=ADAPTER_HELP)(command)


ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""What a request may call an adapter (`MODEL:NAME`): a plain name that cannot read as a path."""


@dataclass(frozen=True)
class AdapterOptions:
    """The `--adapter` values: folders to merge, and (serve) named folders to keep unmerged."""

    merged: tuple[str, ...] = ()
    named: tuple[tuple[str, str], ...] = ()


def split_adapters(values: tuple[str, ...], named_ok: bool) -> AdapterOptions:
    """`--adapter` values -> `AdapterOptions`; a usage error for an empty name or folder, a name
    given twice, or a name where only folders are taken."""
    merged, named = [], []
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep:
            merged.append(value)
            continue
        if not named_ok:
            raise click.BadParameter(f"{value!r}: NAME=DIR adapters are served unmerged (serve only); "
                                     f"give the folder alone to merge it", param_hint="--adapter")
        if not ADAPTER_NAME.fullmatch(name.strip()) or ".." in name or not folder.strip():
            raise click.BadParameter(f"{value!r}: expected NAME=DIR, NAME of letters, digits, '_', "
                                     f"'-' and '.' (a name, never a path), and a folder",
                                     param_hint="--adapter")
        if any(name == other for other, _ in named):
            raise click.BadParameter(f"the adapter name {name!r} is given twice", param_hint="--adapter")
        named.append((name.strip(), folder.strip()))
    return AdapterOptions(tuple(merged), tuple(named))


def attach_named(model: Any, named: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """Read and attach the named adapters unmerged; returns their names (usage errors for bad
    folders)."""
    if not named:
        return ()
    from dllm_decode.adapters import attach, read_adapter
    from dllm_decode.cli.options import usage_errors

    with usage_errors("--adapter"):
        attach(model, [read_adapter(folder, name) for name, folder in named])
    return tuple(name for name, _ in named)
