"""`DRAFTERS`: the `--draft` names, a registry like the schedulers' (name -> factory).

    none | lookup[:MAX_NGRAM] | layerskip:N | layerskip:0,2,3 | dllm[:MODEL] | MODEL

Anything that is not a registered name is a causal-LM draft model (a shipped name such as
`ar_draft`, `smollm2`, a directory, a .gguf file or an HF cache id: the `model` entry).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dllm_decode.interfaces import Scheduler
from dllm_decode.speculative.drafters.base import Drafter
from dllm_decode.speculative.drafters.diffusion import DiffusionDrafter
from dllm_decode.speculative.drafters.layerskip import layerskip_drafter
from dllm_decode.speculative.drafters.lookup import LookupDrafter
from dllm_decode.speculative.drafters.model import ModelDrafter

DRAFT_HELP = ("A causal LM (`ar_draft`, `smollm2`, a directory, a .gguf), `lookup[:MAX_NGRAM]`, "
              "`layerskip:N` (first N target layers) or `layerskip:0,2,3`, `dllm[:MODEL]` "
              "(a diffusion LM drafting a block), or `none` (plain AR).")


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
    """

    target: Any
    device: Any = None
    runtime: str = "auto"
    unmasking: Scheduler | None = None
    drop_text: str = ""


Factory = Callable[[str, DraftContext], "tuple[Drafter | None, Any]"]


def _none(arg: str, context: DraftContext) -> tuple[None, None]:
    if arg:
        raise ValueError(f"`none` takes no argument, got {arg!r}")
    return None, None


def _lookup(arg: str, context: DraftContext) -> tuple[Drafter, None]:
    if not arg:
        return LookupDrafter(), None
    try:
        return LookupDrafter(max_ngram=int(arg)), None
    except ValueError as err:
        raise ValueError(f"lookup: {err}") from None


def _layerskip(arg: str, context: DraftContext) -> tuple[Drafter, Any]:
    drafter = layerskip_drafter(context.target, arg, context.runtime)
    return drafter, drafter.model


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

    model = with_runtime(load_causal_lm(arg, device=context.device), context.runtime)
    _same_vocabulary(context.target, model.config.vocab_size)
    return ModelDrafter(model), model


DRAFTERS: dict[str, Factory] = {
    "none": _none,            # plain AR: the target alone
    "lookup": _lookup,        # prompt lookup / n-gram drafting (Saxena 2023)
    "layerskip": _layerskip,  # the target's first N (or listed) layers (early exit, Draft & Verify)
    "dllm": _dllm,            # a masked diffusion LM drafting a block in parallel (SpecDiff)
    "model": _model,          # a smaller causal LM sharing the tokenizer (Leviathan et al. 2023)
}


def parse_draft(text: str) -> tuple[str, str]:
    """`--draft` text -> (registry name, argument); an unregistered name is a draft model."""
    kind, _, arg = text.strip().partition(":")
    if kind in DRAFTERS and kind != "model":
        return kind, arg.strip()
    return "model", text.strip()


def make_drafter(text: str, context: DraftContext) -> tuple[Drafter | None, Any]:
    """`--draft` text -> (the drafter or None for plain AR, the draft model when there is one).

    Raises:
        ValueError: a bad argument, a draft that does not share the target's vocabulary, or
            (`ModelLoadError`) a draft model that cannot be loaded.
    """
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
