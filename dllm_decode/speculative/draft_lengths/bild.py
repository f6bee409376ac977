"""BiLD's fallback and rollback policies as a draft-length rule (Kim et al., NeurIPS 2023)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from dllm_decode.fields import bounded
from dllm_decode.interfaces import Decision, StepInput
from dllm_decode.speculative.draft_lengths.base import DraftLengthScheduler


@dataclass(frozen=True)
class BildScheduler(DraftLengthScheduler):
    """BiLD, the Big Little Decoder (Kim et al., NeurIPS 2023, arXiv 2302.07863): fallback and
    rollback policies over the small (draft) and large (target) model.

    * Fallback: the small model drafts while its probability of the token it picks stays at or
      above `fallback` (alpha_fb; for a greedy draft that is its max softmax probability, the
      reference's test), at most `max_small` (N) tokens; the first token below it is dropped and
      the large model decides that position. (The draft-length interface verifies at least one
      token: when the very first token fails it is verified anyway, which only helps.)
    * Rollback: the large model's check also keeps a small-model token that is not its argmax
      when its cross-entropy -log p_L(y) is at most `rollback` nats (alpha_rb), and rolls back
      from the first token above it, emitting the large model's token there. Checked at every
      position (the reference code checks only the first position above the threshold, so a
      later one over alpha_rb could slip through there). Not exact: a speed/quality knob;
      greedy only, as the reference. `rollback=None` is exact verification with BiLD's stop
      rule alone ("BiLD-stop").

    Defaults are the reference code's (0.6, 5.0, 10); 0 means 0 here (the reference silently
    replaces a 0 threshold by its default). Stateless.

    Attributes:
        fallback: alpha_fb in [0, 1].
        rollback: alpha_rb >= 0 in nats, or None (exact).
        max_small: N, most consecutive small-model tokens per round.
    """

    fallback: float = 0.6
    rollback: float | None = 5.0
    max_small: int = bounded(10, most=1024, scales="rows")
    early_stops: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.fallback <= 1.0:
            raise ValueError(f"fallback must be in [0, 1], got {self.fallback}")
        if self.rollback is not None and not 0.0 <= self.rollback <= 100.0:
            raise ValueError(f"rollback must be in [0, 100] nats or None, got {self.rollback}")
        if not 1 <= self.max_small <= 256:
            raise ValueError(f"max_small must be in [1, 256], got {self.max_small}")

    def propose_length(self, state: Any) -> int:
        return self.max_small

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        # `confidence` is the running minimum of the draft's probabilities: a leading run.
        return Decision(commit=inp.eligible & (inp.confidence >= self.fallback)), state

    def lenience(self) -> float | None:
        return self.rollback

    def continue_drafting(self, confidence: float) -> bool:
        return confidence >= self.fallback
