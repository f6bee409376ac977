"""Rules applied after the scheduler: learned commit filters and end-of-text truncation."""

from dllm_decode.interfaces import Filter
from filters.eotp import EoTPFilter
from filters.learned import LearnedFilter
from filters.mlp import ConfidenceMLP, load_mlp, save_mlp

FILTERS: dict[str, type[Filter]] = {
    "learned": LearnedFilter,  # Learn2PD: MLP over the block's confidences accepts final predictions
    "eotp": EoTPFilter,        # Learn2PD EoTP: truncate after the committed (or predicted) end of text
}

__all__ = ["FILTERS", "ConfidenceMLP", "EoTPFilter", "LearnedFilter", "load_mlp", "save_mlp"]
