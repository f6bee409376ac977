"""Drafters: who proposes the tokens the target verifies."""

from dllm_decode.speculative.drafters.base import Draft, Drafter
from dllm_decode.speculative.drafters.diffusion import DiffusionDrafter
from dllm_decode.speculative.drafters.layerskip import layer_subset, layerskip_drafter, parse_layers
from dllm_decode.speculative.drafters.lookup import LookupDrafter
from dllm_decode.speculative.drafters.model import ModelDrafter

__all__ = ["DiffusionDrafter", "Draft", "Drafter", "LookupDrafter", "ModelDrafter", "layer_subset",
           "layerskip_drafter", "parse_layers"]
