"""`DRAFTERS`: the `--draft` names, a registry like the schedulers' (name -> factory).

    none | lookup[:MAX_NGRAM] | layerskip:N | layerskip:0,2,3 | dllm[:MODEL] | MODEL
    | staged:FIRST>SECOND[>THIRD...]

Anything that is not a registered name is a causal-LM draft model (a shipped name such as
`ar_draft`, `smollm2`, a directory, a .gguf file or an HF cache id: the `model` entry).
`staged:A>B` is A (a model or layer-skip draft) whose own drafting is speculated by B, any
drafter, read with A's model in the target's place (so `staged:ar_draft>layerskip:1` skips
layers of the draft); `staged:A>B>C` is A sped up by `staged:B>C`. The context's `tree` shape
goes to every stage that can draft a tree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dllm_decode.interfaces import Scheduler
from dllm_decode.speculative.drafters.base import Drafter
from dllm_decode.speculative.drafters.diffusion import DiffusionDrafter
from dllm_decode.speculative.drafters.layerskip import layer_subset, layerskip_drafter, parse_layers
from dllm_decode.speculative.drafters.lookup import LookupDrafter
from dllm_decode.speculative.drafters.model import ModelDrafter
from dllm_decode.speculative.drafters.staged import StagedDrafter
from dllm_decode.speculative.tree import TreeShape

DRAFT_HELP = ("A causal LM (`ar_draft`, `smollm2`, a directory, a .gguf), `lookup[:MAX_NGRAM]`, "
              "`layerskip:N` (first N target layers) or `layerskip:0,2,3`, `dllm[:MODEL]` "
              "(a diffusion LM drafting a block), `staged:FIRST>SECOND` (FIRST, a model or "
              "layerskip draft, itself sped up by SECOND, e.g. `staged:ar_draft>lookup`), or "
              "`none` (plain AR).")


@dataclass(frozen=True)
class DraftContext:
    """What a drafter factory may need besides its own argument.

    Attributes:
        target: the target as transformers loaded it (layer skipping takes its modules; every
            draft must share its vocabulary).
        device: where a draft model is loaded.
        runtime: how a causal-LM or layer-skip draft runs (`hf`, `compact`, `auto`).
        unmasking: a `dllm` draft's unmasking scheduler (None: the threshold rule at 0.9).
        drop_text: text whose tokens a `dllm` draft removes from the context.
        tree: the token-tree shape of drafters that can draft trees (model, layer skip,
            lookup, staged); None drafts chains.
    """

    target: Any
    device: Any = None
    runtime: str = "auto"
    unmasking: Scheduler | None = None
    drop_text: str = ""
    tree: TreeShape | None = None


Factory = Callable[[str, DraftContext], "tuple[Drafter | None, Any]"]


def _none(arg: str, context: DraftContext) -> tuple[None, None]:
    if arg:
        raise ValueError(f"`none` takes no argument, got {arg!r}")
    return None, None


def _lookup(arg: str, context: DraftContext) -> tuple[Drafter, None]:
    if not arg:
        return LookupDrafter(tree=context.tree), None
    try:
        return LookupDrafter(max_ngram=int(arg), tree=context.tree), None
    except ValueError as err:
        raise ValueError(f"lookup: {err}") from None


def _layerskip(arg: str, context: DraftContext) -> tuple[Drafter, Any]:
    drafter = layerskip_drafter(context.target, arg, context.runtime, context.tree)
    source = layer_subset(context.target, parse_layers(arg, len(context.target.model.layers)))
    return drafter, source


def _dllm(arg: str, context: DraftContext) -> tuple[Drafter, Any]:
    from dllm_decode.models.loading import load_model

    model = load_model(arg or "embedded", device=context.device)
    _same_vocabulary(context.target, model.vocab_size)
    unmasking = context.unmasking
    if unmasking is None:
        from dllm_decode.registry import component

        unmasking = component("scheduler", "threshold")
    return DiffusionDrafter(model, unmasking, drop_ids=_token_ids(context.target, context.drop_text)), model


def _model(arg: str, context: DraftContext) -> tuple[Drafter, Any]:
    from dllm_decode.speculative.compact import with_runtime
    from dllm_decode.speculative.models import load_causal_lm

    loaded = load_causal_lm(arg, device=context.device)
    model = with_runtime(loaded, context.runtime)
    _same_vocabulary(context.target, model.config.vocab_size)
    return ModelDrafter(model, context.tree), loaded


def _staged(arg: str, context: DraftContext) -> tuple[Drafter, Any]:
    stages = [part.strip() for part in arg.split(">")]
    if len(stages) < 2 or not all(stages):
        raise ValueError(f"staged expects FIRST>SECOND (e.g. staged:ar_draft>lookup), got {arg!r}")
    first, source = make_drafter(stages[0], context)
    if not isinstance(first, ModelDrafter):
        raise ValueError(f"staged: the first stage must be a draft model or layerskip (it "
                         f"verifies the second stage), got {stages[0]!r}")
    rest = stages[1] if len(stages) == 2 else "staged:" + ">".join(stages[1:])
    second, _ = make_drafter(rest, dataclasses.replace(context, target=source))
    if second is None:
        raise ValueError("staged: the second stage cannot be `none` (that is the first stage alone)")
    return StagedDrafter(first, second), source


DRAFTERS: dict[str, Factory] = {
    "none": _none,            # plain AR: the target alone
    "lookup": _lookup,        # prompt lookup / n-gram drafting (Saxena 2023)
    "layerskip": _layerskip,  # the target's first N (or listed) layers (early exit, Draft & Verify)
    "dllm": _dllm,            # a masked diffusion LM drafting a block in parallel (SpecDiff)
    "model": _model,          # a smaller causal LM sharing the tokenizer (Leviathan et al. 2023)
    "staged": _staged,        # a draft sped up by a cheaper drafter (Spector & Ré 2023, stage 2)
}


def parse_draft(text: str) -> tuple[str, str]:
    """`--draft` text -> (registry name, argument); an unregistered name is a draft model."""
    kind, _, arg = text.strip().partition(":")
    if kind in DRAFTERS and kind != "model":
        return kind, arg.strip()
    return "model", text.strip()


def make_drafter(text: str, context: DraftContext) -> tuple[Drafter | None, Any]:
    """`--draft` text -> (the drafter or None for plain AR, the draft's transformers model when
    there is one: a staged drafter's next stage sees it as its target).

    Raises:
        ValueError: a bad argument, a draft that does not share the target's vocabulary, or
            (`ModelLoadError`) a draft model that cannot be loaded.
    """
    if not isinstance(text, str):
        raise TypeError(f"the draft must be text such as 'none', 'ar_draft' or 'lookup:3', got "
                        f"{type(text).__name__} {text!r}")
    if not text.strip():
        raise ValueError(f"the draft is empty. {DRAFT_HELP}")
    kind, arg = parse_draft(text)
    return DRAFTERS[kind](arg, context)


def _same_vocabulary(target: Any, size: int) -> None:
    if int(target.config.vocab_size) != int(size):
        raise ValueError(f"the draft must share the target's tokenizer; vocabulary sizes differ "
                         f"({size} vs {target.config.vocab_size})")


def _token_ids(target: Any, text: str) -> tuple[int, ...]:
    if not text.strip():
        return ()
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("dropping text from a dLLM draft's context needs a target with a tokenizer")
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
