"""The short `--draft` spellings, read into `DRAFTERS` entries, and `make_drafter`.

    none | lookup[:MAX_NGRAM] | layerskip:N | layerskip:0,2,3 | dllm[:MODEL] | MODEL
    | staged:FIRST>SECOND[>THIRD...]

`NAME:ARG` sets the entry's main option (`lookup:3` is `{"name": "lookup", "max_ngram": 3}`).
Anything that is not a registered name is a causal-LM draft model (a shipped name such as
`ar_draft`, `smollm2`, a directory, a .gguf file or an HF cache id: the `model` entry).
`staged:A>B` is A (a model or layer-skip draft) whose own drafting is speculated by B, and
`staged:A>B>C` is A sped up by `staged:B>C`. Every option of an entry is also reachable as
`{"name": ..., option: value}` (dotted keys for the stages of `staged`), the form
`registry.component("drafter", ...)` and the CLI's `--draft-opt` take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dllm_decode.speculative.drafters.spec import Built, DraftContext, DraftSpec

SPELLINGS = {
    "none": "`none` (plain AR)",
    "lookup": "`lookup[:MAX_NGRAM]`",
    "layerskip": "`layerskip:N` (first N target layers) or `layerskip:0,2,3`",
    "dllm": "`dllm[:MODEL]` (a diffusion LM drafting a block)",
    "model": "a causal LM (`ar_draft`, `smollm2`, a directory, a .gguf)",
    "staged": "`staged:FIRST>SECOND` (FIRST, a model or layerskip draft, itself sped up by SECOND, "
              "e.g. `staged:ar_draft>lookup`)",
}
"""The short spelling of each `DRAFTERS` entry; an entry without one is shown as its name."""


def draft_help() -> str:
    """The accepted `--draft` spellings, one per `DRAFTERS` entry in registry order."""
    from dllm_decode.speculative.drafters import DRAFTERS

    return "A draft: " + "; ".join(SPELLINGS.get(name, f"`{name}`") for name in DRAFTERS) + "."

MAIN_OPTION = {"lookup": "max_ngram", "layerskip": "layers", "dllm": "model", "model": "model"}
"""The option `NAME:ARG` sets, per entry that takes one."""


def parse_draft(text: str) -> dict[str, Any]:
    """A short `--draft` spelling as a `{"name": entry, option: value}` mapping.

    Raises:
        ValueError: an empty spelling, an argument to an entry that takes none, or a staged
            spelling with fewer than two stages.
    """
    from dllm_decode.speculative.drafters import DRAFTERS

    text = text.strip()
    if not text:
        raise ValueError(f"the draft is empty. {draft_help()}")
    name, colon, arg = text.partition(":")
    if name not in DRAFTERS:
        return {"name": "model", "model": text}
    arg = arg.strip()
    if not colon:
        return {"name": name}
    if name == "staged":
        stages = [part.strip() for part in arg.split(">")]
        if len(stages) < 2 or not all(stages):
            raise ValueError(f"staged expects FIRST>SECOND (e.g. staged:ar_draft>lookup), got {arg!r}")
        rest = stages[1] if len(stages) == 2 else "staged:" + ">".join(stages[1:])
        return {"name": "staged", "first": parse_draft(stages[0]), "second": parse_draft(rest)}
    if name not in MAIN_OPTION:
        raise ValueError(f"`{name}` takes no argument, got {arg!r}")
    return {"name": name, MAIN_OPTION[name]: arg}


def draft_spec(spec: str | Mapping[str, Any] | DraftSpec,
               options: Mapping[str, Any] | None = None) -> DraftSpec:
    """A `DRAFTERS` entry from a short spelling, a `{"name": ..., option: value}` mapping or an
    entry itself; `options` (text or typed values, dotted keys for nested stages) override.

    Raises:
        TypeError: a spec of another type.
        ValueError: unknown entry or option, or a value the entry refuses (one line).
    """
    from dllm_decode.registry import component, component_dict

    if isinstance(spec, DraftSpec):
        spec = component_dict(spec) if options else spec
    elif isinstance(spec, str):
        spec = parse_draft(spec)
    elif not isinstance(spec, Mapping):
        raise TypeError(f"the draft must be text such as 'none', 'ar_draft' or 'lookup:3', a "
                        f"mapping with 'name' or a DraftSpec, got {type(spec).__name__} {spec!r}")
    if options:
        spec = {**spec, **options}
    try:
        return component("drafter", spec)
    except ValueError as err:
        raise ValueError(f"{err}. {draft_help()}" if "unknown drafter" in str(err) else str(err)) from None


def make_drafter(spec: str | Mapping[str, Any] | DraftSpec, context: DraftContext,
                 options: Mapping[str, Any] | None = None) -> Built:
    """The drafter (None for plain AR) that `spec` names, built for `context.target`, and the
    draft's transformers model when there is one (`Built`; see `draft_spec` for `spec`).

    Raises:
        ValueError: a bad spelling or option, a draft that does not share the target's
            vocabulary, or (`ModelLoadError`) a draft model that cannot be loaded.
    """
    return draft_spec(spec, options).build(context)
