"""The canvas step by step, rebuilt from `generate(..., trace=True)`'s record: the one model the
terminal animation, the HTML trace and the order metrics read, so the views agree cell by cell.

A `Frame` is the canvas of one sample after one decode step: per position the token it shows
(committed, or the step's provisional prediction of a still-masked position), its state
(`STATES`), the confidence the step saw there, and which positions the step took back or edited.
The states are the provisional stream's: "committed", "provisional", "masked", "noise" (a
uniform-noise canvas's uncommitted position).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

END_OF_TEXT = "∎"
STATES = ("committed", "provisional", "masked", "noise")


@dataclass(frozen=True)
class Frame:
    """One sample's canvas after step `step` (1-based).

    Attributes:
        step: the sample's step count (a forward pass each, cache refreshes included).
        tokens: per position the token id shown (None where masked).
        state: per position one of `STATES`.
        confidence: per position the confidence the step saw (None where the step saw none).
        committed: positions committed by this step.
        revised: positions this step took back (re-masked) or edited.
    """

    step: int
    tokens: tuple[int | None, ...]
    state: tuple[str, ...]
    confidence: tuple[float | None, ...]
    committed: tuple[int, ...]
    revised: tuple[int, ...]


@dataclass(frozen=True)
class SampleTrace:
    """One sample's decode as frames, plus where each position was finalised.

    Attributes:
        frames: one `Frame` per step.
        final: the canvas `generate` returned (the last frame shows it).
        finalized_at: per position the step whose write stayed (its last commit or edit).
        revisions: per position how often a step took it back or edited it.
        answer_length: positions before the first end-of-text.
    """

    frames: tuple[Frame, ...]
    final: tuple[int, ...]
    finalized_at: tuple[int, ...]
    revisions: tuple[int, ...]
    answer_length: int

    @property
    def steps(self) -> int:
        return len(self.frames)


@dataclass
class _Canvas:
    tokens: list[int | None]
    state: list[str]
    finalized_at: list[int]
    revisions: list[int] = field(default_factory=list)


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def sample_frames(trace: list[dict[str, Any]], row: int, final: list[int], answer_length: int,
                  blank: str = "masked") -> SampleTrace:
    """Sample `row`'s frames from a `DecodeResult.trace` (entries whose "rows" hold it).

    The last frame is reconciled with `final`: positions the loop filled after the sample's last
    step (end-of-text padding after a stop, a truncation) show there as committed by that step.
    """
    width = len(final)
    canvas = _Canvas([None] * width, [blank] * width, [0] * width, [0] * width)
    frames: list[Frame] = []
    for entry in trace:
        hits = (entry["rows"] == row).nonzero()
        if hits.numel() == 0:
            continue
        i = int(hits[0, 0])
        step = len(frames) + 1
        for p, s in enumerate(canvas.state):            # a prediction lasts one step
            if s == "provisional":
                canvas.state[p], canvas.tokens[p] = blank, None
        frames.append(_apply(canvas, entry, i, step))
    if frames:
        last = frames[-1]
        tokens, state = list(last.tokens), list(last.state)
        committed = set(last.committed)
        for p, tok in enumerate(final):
            if tokens[p] != tok or state[p] != "committed":
                tokens[p], state[p] = tok, "committed"
                canvas.finalized_at[p] = last.step
                committed.add(p)
        frames[-1] = Frame(last.step, tuple(tokens), tuple(state), last.confidence,
                           tuple(sorted(committed)), last.revised)
    return SampleTrace(tuple(frames), tuple(final), tuple(canvas.finalized_at),
                       tuple(canvas.revisions), answer_length)


def _apply(canvas: _Canvas, entry: dict[str, Any], i: int, step: int) -> Frame:
    offset = int(entry["offset"])
    commit = entry["commit"][i].tolist()
    tokens = entry["tokens"][i].tolist()
    conf = entry["confidence"][i].tolist()
    remask = entry["remask"][i].tolist() if "remask" in entry else [False] * len(commit)
    edit = entry["edit"][i].tolist() if "edit" in entry else [False] * len(commit)
    width = len(canvas.tokens)
    confidence: list[float | None] = [None] * width
    committed, revised = [], []
    for j, (c, tok, k, r, e) in enumerate(zip(commit, tokens, conf, remask, edit)):
        p = offset + j
        if not 0 <= p < width:
            continue
        confidence[p] = _finite(k)
        if r:
            canvas.tokens[p], canvas.state[p] = None, "masked"
            canvas.revisions[p] += 1
            revised.append(p)
        elif c or e:
            canvas.tokens[p], canvas.state[p] = int(tok), "committed"
            canvas.finalized_at[p] = step
            if c:
                committed.append(p)
            if e:
                canvas.revisions[p] += 1
                revised.append(p)
        elif canvas.state[p] != "committed" and confidence[p] is not None:
            canvas.tokens[p], canvas.state[p] = int(tok), "provisional"
    return Frame(step, tuple(canvas.tokens), tuple(canvas.state), tuple(confidence),
                 tuple(committed), tuple(revised))


def result_frames(result: Any) -> list[SampleTrace]:
    """Every sample's `SampleTrace` from a `DecodeResult` decoded with `trace=True`.

    Raises:
        ValueError: the result carries no trace.
    """
    if result.trace is None:
        raise ValueError("this result has no trace; decode with generate(..., trace=True)")
    finals = result.tokens.tolist()
    lengths = result.answer_lengths.tolist()
    return [sample_frames(result.trace, b, finals[b], int(lengths[b])) for b in range(len(finals))]


def token_labels(tokenizer: Any, ids: set[int]) -> dict[int, str]:
    """A short printable label per token id: the tokenizer's text for it (end-of-text as `∎`,
    other special tokens as their markup, a newline as a return sign), or the id itself without
    a tokenizer."""
    labels = {}
    eos = getattr(tokenizer, "eos_token_id", None)
    for tok in sorted(ids):
        text = str(tok)
        if tok == eos:
            text = END_OF_TEXT
        elif tokenizer is not None:
            try:
                text = tokenizer.decode([tok], skip_special_tokens=False)
            except Exception:         # a tokenizer that cannot decode one id: show the id
                text = str(tok)
        text = text.replace("\n", "⏎").replace("\t", "⇥").strip() or "␣"
        labels[tok] = text
    return labels


def used_ids(samples: list[SampleTrace]) -> set[int]:
    """Every token id any frame of `samples` shows."""
    return {tok for s in samples for f in s.frames for tok in f.tokens if tok is not None}
