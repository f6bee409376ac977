"""End-of-Text Prediction (EoTP): stop decoding, and attending to, everything after the answer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.interfaces import Decision, Filter, StepInput
from dllm_decode.ops import argmax_mask

MODES = ("committed", "predicted")


@dataclass(frozen=True)
class EoTPFilter(Filter):
    """Truncate a row's generation region right after its end of text.

    Learn2PD's EoTP (arXiv 2509.25188; `ims-kdks/Learning-to-Parallel-Decoding@342293c:
    llada/generate.py`, `generate_l2p_eot`). The loop turns truncated columns into end-of-text,
    drops them from attention (and from every later forward) and never decodes them.

    `committed` (the paper, default): once this step commits an end-of-text token, truncate at
    the column after the first one. Nothing before a committed EOS is ever dropped, so the answer
    is the one the base rule decodes, except that the tail no longer takes part in attention.
    `predicted` (the code's more aggressive variant): in addition, when no EOS is committed, a
    masked column anywhere in view (after the block start) whose candidate is EOS with
    probability >= `eos_threshold` truncates the row right after the most confident such
    column; that column itself stays masked and is decoded as usual.

    Put it last in the filter list: it reads the step's final commits (`Decision.resolve`, the
    loop's own rules, forced progress included), so a forced EOS truncates in the same step, and
    returns them resolved.

    Attributes:
        mode: `committed` or `predicted`.
        eos_threshold: minimum EOS probability of a prediction in `predicted` mode, in (0, 1].
    Raises:
        ValueError: unknown mode or threshold out of range.
    """

    mode: str = "committed"
    eos_threshold: float = 0.9

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        if not 0.0 < self.eos_threshold <= 1.0:
            raise ValueError(f"eos_threshold must be in (0, 1], got {self.eos_threshold}")

    @property
    def view(self) -> str:                      # type: ignore[override]
        """`predicted` looks past the block for predicted ends; `committed` needs the block only."""
        return "rest" if self.mode == "predicted" else "block"

    def __call__(self, inp: StepInput, decision: Decision) -> Decision:
        commit, tokens = decision.resolve(inp)
        cut = _after_first(commit & self._is_eos(inp, tokens), inp.offset)
        if self.mode == "predicted":
            predicted = inp.is_masked & ~commit & self._is_eos(inp, inp.candidates)
            p_eos = inp.probs.gather(-1, inp.candidates.unsqueeze(-1)).squeeze(-1)
            score = torch.where(predicted & (p_eos >= self.eos_threshold), p_eos, -torch.inf)
            best = argmax_mask(score)
            cut = torch.where(cut < _NEVER, cut, _after_first(best, inp.offset))
        truncate_at = torch.minimum(cut, inp.gen_span[:, 1])
        if decision.truncate_at is not None:
            truncate_at = torch.minimum(truncate_at, decision.truncate_at)
        return dataclasses.replace(decision, commit=commit, tokens=tokens, truncate_at=truncate_at)

    @staticmethod
    def _is_eos(inp: StepInput, tokens: Tensor) -> Tensor:
        if not inp.eos_ids:
            raise ValueError("EoTP needs the model's end-of-text ids (StepInput.eos_ids is empty)")
        return torch.isin(tokens, torch.tensor(inp.eos_ids, device=tokens.device))


_NEVER = torch.iinfo(torch.long).max


def _after_first(hits: Tensor, offset: int) -> Tensor:
    """(B, W) bool -> (B,) canvas column after each row's first hit (`_NEVER` without one)."""
    column = torch.arange(hits.shape[1], device=hits.device) + offset
    first = torch.where(hits, column, _NEVER).amin(-1)
    return torch.where(first < _NEVER, first + 1, _NEVER)
