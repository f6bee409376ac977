"""HF assisted generation's heuristic draft length: +2 after a fully accepted draft, -1 otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Decision, StepInput
from dllm_decode.speculative.draft_lengths.base import DraftLengthScheduler


@dataclass(frozen=True)
class HeuristicScheduler(DraftLengthScheduler):
    """HF's heuristic draft length: +`increase` after a fully accepted draft, -`decrease` otherwise.

    HF `AssistedCandidateGenerator.update_candidate_strategy` with `num_assistant_tokens_schedule=
    "heuristic"`; the state is reset per request (HF's `heuristic_transient`: HF's `heuristic`
    carries gamma across `generate` calls, which makes benchmarks depend on call order).
    Default start 5 (HF's `num_assistant_tokens` while heuristic was the default, < v4.45).
    AR-only: it needs verification feedback, which the diffusion loop has no notion of.

    Attributes:
        initial: draft length of the first round.
        increase: added after a round whose drafts were all accepted.
        decrease: removed after a round with a rejection.
        minimum: lower bound of the draft length.
        maximum: upper bound (the loop's `max_draft` caps it too).
    """

    cuts: ClassVar[bool] = False

    initial: int = bounded(5, most=1024, scales="rows")
    increase: int = bounded(2, most=MAX_CANVAS, scales="memory")
    decrease: int = bounded(1, most=MAX_CANVAS, scales="memory")
    minimum: int = bounded(1, most=MAX_CANVAS, scales="memory")
    maximum: int = bounded(64, most=1024, scales="rows")

    def __post_init__(self) -> None:
        if self.minimum < 1:
            raise ValueError(f"minimum must be >= 1, got {self.minimum}")
        if self.maximum < self.minimum:
            raise ValueError(f"maximum must be >= minimum ({self.minimum}), got {self.maximum}")
        if not self.minimum <= self.initial <= self.maximum:
            raise ValueError(f"initial must be in [{self.minimum}, {self.maximum}], got {self.initial}")
        if self.increase < 0 or self.decrease < 0:
            raise ValueError(f"increase and decrease must be >= 0, got {self.increase}, {self.decrease}")

    def init_state(self, batch_size: int, device: torch.device) -> int:
        return self.initial

    def propose_length(self, state: int) -> int:
        return state

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        return Decision(commit=inp.eligible), state          # the width already is the choice

    def feedback(self, state: int, drafted: int, accepted: int) -> int:
        step = self.increase if accepted >= drafted else -self.decrease
        return max(self.minimum, min(self.maximum, state + step))
