"""Rules applied after the scheduler: learned commit filters and end-of-text truncation."""

from dllm_decode._namespace import require_namespaced

require_namespaced(__name__)

from dllm_decode.interfaces import Filter
from dllm_decode.filters.eotp import EoTPFilter
from dllm_decode.filters.learned import LearnedFilter
from dllm_decode.filters.mlp import ConfidenceMLP, load_mlp, save_mlp

FILTERS: dict[str, type[Filter]] = {
    "learned": LearnedFilter,  # Learn2PD: MLP over the block's confidences accepts final predictions
    "eotp": EoTPFilter,        # Learn2PD EoTP: truncate after the committed (or predicted) end of text
}

__all__ = ["FILTERS", "ConfidenceMLP", "EoTPFilter", "LearnedFilter", "load_mlp", "save_mlp"]
