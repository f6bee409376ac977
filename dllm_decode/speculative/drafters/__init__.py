"""Drafters: who proposes the tokens the target verifies; `DRAFTERS` names them."""

from dllm_decode.speculative.drafters.base import Draft, Drafter
from dllm_decode.speculative.drafters.diffusion import DiffusionDrafter
from dllm_decode.speculative.drafters.layerskip import layer_subset, layerskip_drafter, parse_layers
from dllm_decode.speculative.drafters.lookup import LookupDrafter
from dllm_decode.speculative.drafters.model import ModelDrafter
from dllm_decode.speculative.drafters.registry import (DRAFT_HELP, DRAFTERS, DraftContext,
                                                       make_drafter, parse_draft)
from dllm_decode.speculative.drafters.staged import StagedDrafter

__all__ = ["DRAFTERS", "DRAFT_HELP", "DiffusionDrafter", "Draft", "DraftContext", "Drafter",
           "LookupDrafter", "ModelDrafter", "StagedDrafter", "layer_subset", "layerskip_drafter", "make_drafter",
           "parse_draft", "parse_layers"]
