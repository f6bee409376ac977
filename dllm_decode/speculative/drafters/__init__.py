"""Drafters: who proposes the tokens the target verifies; `DRAFTERS` names them.

A `DRAFTERS` entry is a frozen dataclass of the drafter's options (`DraftSpec`), built by
`registry.build` like a scheduler, that builds the drafter for one target (`DraftSpec.build`
with a `DraftContext`). `make_drafter` also reads the short `--draft` spellings
(`dllm_decode.speculative.drafters.spelling`).
"""

from dllm_decode.speculative.drafters.base import Draft, Drafter
from dllm_decode.speculative.drafters.diffusion import DiffusionDraft, DiffusionDrafter
from dllm_decode.speculative.drafters.layerskip import (LayerSkipDraft, layer_subset, layerskip_drafter,
                                                        parse_layers)
from dllm_decode.speculative.drafters.lookup import LookupDraft, LookupDrafter
from dllm_decode.speculative.drafters.model import ModelDraft, ModelDrafter
from dllm_decode.speculative.drafters.spec import Built, DraftContext, DraftSpec, NoDraft
from dllm_decode.speculative.drafters.spelling import draft_help, draft_spec, make_drafter, parse_draft
from dllm_decode.speculative.drafters.staged import StagedDraft, StagedDrafter

DRAFTERS: dict[str, type[DraftSpec]] = {
    "none": NoDraft,              # plain AR: the target alone
    "lookup": LookupDraft,        # prompt lookup / n-gram drafting (Saxena 2023)
    "layerskip": LayerSkipDraft,  # the target's first N (or listed) layers (early exit, Draft & Verify)
    "dllm": DiffusionDraft,       # a masked diffusion LM drafting a block in parallel (SpecDiff)
    "model": ModelDraft,          # a smaller causal LM sharing the tokenizer (Leviathan et al. 2023)
    "staged": StagedDraft,        # a draft sped up by a cheaper drafter (Spector & Ré 2023, stage 2)
}

__all__ = ["DRAFTERS", "Built", "DiffusionDraft", "DiffusionDrafter", "Draft",
           "DraftContext", "DraftSpec", "Drafter", "LayerSkipDraft", "LookupDraft", "LookupDrafter",
           "ModelDraft", "ModelDrafter", "NoDraft", "StagedDraft", "StagedDrafter", "draft_spec",
           "draft_help", "layer_subset", "layerskip_drafter", "make_drafter", "parse_draft",
           "parse_layers", "tree_drafters"]


def tree_drafters() -> tuple[str, ...]:
    """The `DRAFTERS` entries that can draft a token tree (`DraftSpec.drafts_trees`)."""
    return tuple(name for name, spec in DRAFTERS.items() if spec.drafts_trees)


def __getattr__(name: str) -> str:
    if name == "DRAFT_HELP":          # the old constant, now computed from the registry
        return draft_help()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
