"""Provisional canvas snapshots: what a request's canvas holds after a step, position by position,
for streaming the canvas as it denoises (the server's `"stream_mode": "provisional"`).

Each position of the generation region is in one of `STATES`:
- `committed`: written by the loop (it changes again only under a rule that revises);
- `provisional`: still masked and a column the step's rule could commit (its
  `StepInput.eligible`: in the active block's commit region, so the same cells the trace's
  frames show), with the step's proposed token (its `StepInput.candidates`, the argmax or
  the sampled draw the rule chose from): it may change;
- `masked`: still masked and not proposed (a later block, or a column the step could not commit);
- `noise`: an uncommitted position holding noise rather than a mask (a canvas kind whose
  uncommitted positions are redrawn noise); no family served today has one, so it is not emitted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from torch import Tensor

STATES = ("committed", "provisional", "masked", "noise")


class Proposal(NamedTuple):
    """A step's proposals for one request, in generation-region columns.

    Attributes:
        start: the generation-region column of window column 0 (may be negative: the window may
            start before the generation region under some caches).
        candidates: (n, W) the proposed token per window column (device tensor; read lazily).
        eligible: (n, W) bool, the window columns the step's rule could commit.
    """

    start: int
    candidates: Tensor
    eligible: Tensor


def proposal(inp: Any, gen_start: int) -> Proposal:
    """The step's proposals (`inp` is its `StepInput`) relative to a row's generation start."""
    return Proposal(int(inp.offset) - gen_start, inp.candidates.detach().clone(),
                    inp.eligible.detach().clone())


class Canvas(NamedTuple):
    """One row's generation region as ids (None where nothing is proposed) and states, and the
    forward passes the request took part in so far."""

    ids: list[int | None]
    state: list[str]
    nfe: int = 0


def canvas(tokens: Sequence[int], mask_id: int, found: Proposal | None, nfe: int = 0, row: int = 0) -> Canvas:
    """Row `row`'s canvas `tokens` (the generation region, [MASK] where undecided) with the
    step's proposals filled in where still masked and eligible."""
    ids: list[int | None] = list(tokens)
    state = ["masked" if t == mask_id else "committed" for t in tokens]
    if found is not None:
        candidates, eligible = found.candidates[row].tolist(), found.eligible[row].tolist()
        for column in range(max(found.start, 0), min(found.start + len(candidates), len(ids))):
            proposed = candidates[column - found.start]
            if state[column] == "masked" and eligible[column - found.start] and proposed != mask_id:
                ids[column], state[column] = proposed, "provisional"
    for column, kind in enumerate(state):
        if kind == "masked":
            ids[column] = None
    return Canvas(ids, state, nfe)


@dataclass(frozen=True)
class Draft:
    """A provisional snapshot as the server streams it (`to_dict` is the chunk's `dllm` object).

    Attributes:
        step: the request's steps so far (1 after its first).
        nfe: forward passes the request took part in so far.
        tokens: per generation-region position, its token as text, or None where masked.
        state: per position, one of `STATES`.
        committed_text: the answer text that is final so far (what the stream has sent).
    """

    step: int
    nfe: int
    tokens: tuple[str | None, ...]
    state: tuple[str, ...]
    committed_text: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "provisional", "step": self.step, "nfe": self.nfe, "tokens": list(self.tokens),
                "state": list(self.state), "committed_text": self.committed_text}


def draft(view: Canvas, step: int, committed_text: str,
          decode: Callable[[list[list[int]]], list[str]] | None) -> Draft:
    """The `Draft` of a canvas view: token ids become text with `decode` (a tokenizer's
    `batch_decode`; None: the ids as decimal strings)."""
    known = [(i, t) for i, t in enumerate(view.ids) if t is not None]
    texts = decode([[t] for _, t in known]) if decode is not None and known else [str(t) for _, t in known]
    tokens: list[str | None] = [None] * len(view.ids)
    for (i, _), text in zip(known, texts):
        tokens[i] = text
    return Draft(step, view.nfe, tuple(tokens), tuple(view.state), committed_text)
