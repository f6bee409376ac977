"""AR-only draft-length rules: schedulers that pick how many tokens to draft from verification
feedback, which the diffusion loop has no notion of; `DRAFT_LENGTHS` names them.

The speculative loop also takes any diffusion scheduler as its draft-length rule
(`dllm_decode.speculative.schedule` says how each maps); these are the rules beside them.
"""

from dllm_decode.interfaces import Scheduler
from dllm_decode.speculative.draft_lengths.base import DraftLengthScheduler
from dllm_decode.speculative.draft_lengths.bild import BildScheduler
from dllm_decode.speculative.draft_lengths.heuristic import HeuristicScheduler

DRAFT_LENGTHS: dict[str, type[Scheduler]] = {
    "heuristic": HeuristicScheduler,    # HF assisted generation, +2 / -1 (AR-only)
    "bild": BildScheduler,              # BiLD fallback + rollback (Kim et al. 2023; lossy rollback)
}

__all__ = ["DRAFT_LENGTHS", "BildScheduler", "DraftLengthScheduler", "HeuristicScheduler"]
