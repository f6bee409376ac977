"""The named records a step hands on: what each request's step did (`Outcome`), what the step's
one host sync reads back (`Progress`) and what the host decides from it (`Settled`).

Features plug into the loop through these records (a field added here, filled where it is made,
read where it is used), never through a copy of the loop or the step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from dllm_decode.interfaces import Decision, StepInput
from dllm_decode.step import Resolved, Window


@dataclass(frozen=True)
class Outcome:
    """One request's step over its b rows of the window.

    Attributes:
        resolved: the (b, W) commits, tokens, re-masks and edits to write.
        worked: (b,) bool, the row had work (it counts the forward).
        edited: (b,) bool, the row edited a committed token (an edit pass runs again).
        gen_end: (b,) long, the row's generation end after the step (a truncation moves it).
        nonfinite: (b,) bool, the row's model logits were not finite.
        truncates: a row of the request truncated its answer (the canvas tail is cut).
    """

    resolved: Resolved
    worked: Tensor
    edited: Tensor
    gen_end: Tensor
    nonfinite: Tensor
    truncates: bool = False

    @classmethod
    def of(cls, inp: StepInput, decision: Decision, resolved: Resolved, nonfinite: Tensor,
           revising: Tensor) -> Outcome:
        """The outcome of a decided step: a row worked when it had an eligible column, finished
        its block or runs an edit pass (`revising`, (b,) bool)."""
        finish = decision.finish if decision.finish is not None else torch.zeros_like(inp.live)
        end = inp.gen_span[:, 1] if decision.truncate_at is None else \
            torch.minimum(inp.gen_span[:, 1], decision.truncate_at)
        return cls(resolved, inp.live | finish | revising, resolved.edit.any(-1), end, nonfinite,
                   decision.truncate_at is not None)

    @classmethod
    def idle(cls, window: Window) -> Outcome:
        """The outcome of rows that take no step (their blocks are done; they wait for the
        phase to end): nothing written, no work, their generation ends kept."""
        none = torch.zeros_like(window.tokens, dtype=torch.bool)
        return cls(Resolved(none, none.long(), none, none), none[:, 0], none[:, 0],
                   window.gen_span[:, 1], none[:, 0])

    @classmethod
    def join(cls, parts: list[Outcome]) -> Outcome:
        """The members' outcomes, in member order: the batch's rows in order."""
        if len(parts) == 1:
            return parts[0]
        cat = lambda ts: torch.cat(list(ts))                         # noqa: E731
        resolved = Resolved(*(cat(column) for column in zip(*(p.resolved for p in parts))))
        tensors = {f.name: cat(getattr(p, f.name) for p in parts) for f in fields(cls)
                   if f.name not in ("resolved", "truncates")}
        return cls(resolved, truncates=any(p.truncates for p in parts), **tensors)


@dataclass(frozen=True)
class Progress:
    """The step's one host read, per batch row: masks left in its block and in its generation
    region, an end-of-text in its block, whether it edited, its generation end, and whether its
    logits were not finite."""

    block_left: list[int]
    gen_left: list[int]
    block_eos: list[int]
    edited: list[int]
    gen_end: list[int]
    nonfinite: list[int]


@dataclass(frozen=True)
class Settled:
    """What the host decided from a step's `Progress`: the rows that are done, whether the phase
    is over, and the phase's step cap (one step per position and edit pass, plus one)."""

    done: list[bool]
    phase_over: bool
    cap: int
