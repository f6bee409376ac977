"""`DraftLengthScheduler`: a scheduler that also chooses how many tokens to draft and learns
from verification (the AR-only draft-length rules subclass it)."""

from __future__ import annotations

from typing import Any, ClassVar

from dllm_decode.interfaces import Scheduler


class DraftLengthScheduler(Scheduler):
    """A scheduler that also chooses how many tokens to draft and learns from verification.

    The propose/feedback pair of HF's `CandidateGenerator` (`get_candidates` length and
    `update_candidate_strategy(..., num_matches)`), as optional hooks over the explicit state,
    plus the verification rule's lenience (BiLD's rollback).

    Class attributes:
        early_stops: a drafter that drafts token by token stops as soon as `select` (on a fresh
            state) would cut before its newest token (`EarlyStop`); off for rules whose `select`
            cuts nothing (the width already is their choice).
        cuts: `select` may verify fewer tokens than were drafted; False (the width already is
            the choice) lets the loop skip asking it each round.
    """

    early_stops: ClassVar[bool] = False
    cuts: ClassVar[bool] = True

    def propose_length(self, state: Any) -> int | None:
        """Tokens to draft this round (the loop caps it at `max_draft`), or None for the cap."""
        return None

    def feedback(self, state: Any, drafted: int, accepted: int) -> Any:
        """The target accepted `accepted` of `drafted` tokens; return the new state."""
        return state

    def lenience(self) -> float | None:
        """Nats of target cross-entropy under which a non-argmax draft token is still accepted
        by greedy verification (BiLD's rollback threshold; not exact), or None: exact."""
        return None

    def continue_drafting(self, confidence: float) -> bool | None:
        """Fast early-stop test on the newest drafted token's confidence, asked after each
        drafted token before the full `select`: False stops drafting, True continues, None
        asks `select` (through `schedule.EarlyStop`)."""
        return None
