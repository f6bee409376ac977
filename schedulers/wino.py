"""WINO: wide-in, narrow-out revocable decoding (arXiv 2507.18578)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import NEG_INF, topk_mask

FIRST_LAST_ACCEPT = 30
"""The reference's `last_accept` at a block start (only read by `reference_cap`)."""


@dataclass(frozen=True)
class WinoScheduler(Scheduler):
    """Commit wide at a low bar, then take back the block's tokens that fail verification.

    WINO (Hong et al., 2025, arXiv 2507.18578; `Feng-Hong/WINO-DLLM@9549a1d:LLaDA/decoding.py
    decoding_wino`), per row and step, in the active
    block:

    * wide-in: A = the masked positions with p(x̂) > tau_1 (`threshold`, strict `>`, as the
      reference); at most `max_accept` of them, the most confident, where the cap is
      min(max(floor(`accept_ratio` * masked in the block), `min_accept`), `max_accept`), recomputed
      every step (the reference's 0.7 / 5 / 20); when none clears the bar, the most confident one;
    * narrow-out, only when |A| > 1: R = the block's tokens committed in EARLIER steps whose
      verification score for their current token is < tau_2 (`threshold_back`, strict `<`: a
      score equal to tau_2 stays); by default at most |A| - 1 of them, the lowest scores first,
      so every step leaves at least one mask fewer (the d2Cache port's guaranteed-progress cap).
      Tokens committed in this step are verified from the next step on.

    Defaults: tau_1 = 0.7 (the reference's configs: 0.7 for MATH-500, HumanEval and Sudoku, 0.6
    GSM8K, 0.8 MBPP, 0.5 ARC/Countdown; 0.7 in the d2Cache port's YAML), tau_2 = 0.9 (every
    config); the paper decodes gen 256 with block 128 at temperature 0. The accept cap was set
    for long real answers; on an end-of-text-padded canvas it throttles the padding too (at most
    20 per step), so a block of 256 takes >= 13 forwards where `threshold` may take a few
    (`dllm-decode bench schedulers` measures both); set `max_accept=0` to lift it (confidences are read in float32, the loop's, not float64).

    Deviation (verification score): the reference appends a shadow copy of the block (B extra
    rows, input [MASK], each at the position of its block column, seeing every main column but
    its own: leave-one-out) and scores committed token j by its shadow row. Here the score is
    p(current token) at column j under the step's ordinary forward, in which token j itself is
    input. That costs no extra rows, needs no 4-D attention mask, and keeps the prefix and dual
    caches usable (the window's logits cover the whole block); but it is not leave-one-out: a
    masked-diffusion model (LLaDA, the embedded model) is trained only at masked positions, so
    its prediction at a committed one is untrained. On the embedded model, tokens that differ from
    the one-token-per-step decode score low under both scores, but under this one many more of
    the agreeing tokens score low too than under leave-one-out, so this score re-masks more good
    tokens than the reference's would (each costs a later commit, never a mask left).
    Like the reference, it only verifies tokens of a block that is still open: a step that fills
    the block is never checked.

    Fixes of the reference's pitfalls: batched (per-row caps and counts, where the reference
    takes a top-k over the flattened batch and shares one `last_accept`); termination (the
    reference re-masks up to `last_accept` - 1 tokens after accepting 2, so a block's mask count
    can grow and nothing bounds the loop: here at most |A| - 1 re-masks per row and step, the
    loop's `MAX_REVISIONS` per column and its hard step cap); no cache possible (shadow rows;
    see the deviation). `reference_cap=True` restores the reference's count rule (when |R| >=
    last accept, keep the last accept - 1 lowest; `last_accept` starts at 30 per block) on top of
    which the loop still keeps at most |A| - 1. Re-masking never leaves the active block
    (`revises = "block"`), as in the reference. The reference's prompt builder (two extra
    newlines after the chat template, d2Cache PR #7) is not a scheduler matter and not copied.
    """

    revises: ClassVar[str] = "block"

    threshold: float = 0.7
    threshold_back: float = 0.9
    accept_ratio: float = 0.7
    min_accept: int = bounded(5, most=MAX_CANVAS, scales="memory")
    max_accept: int = bounded(20, most=MAX_CANVAS, scales="memory")
    reference_cap: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold must be in [0, 1) (a strict `>` bar), got {self.threshold}")
        if not 0.0 <= self.threshold_back <= 1.0:
            raise ValueError(f"threshold_back must be in [0, 1] (a strict `<` bar), got {self.threshold_back}")
        if not 0.0 < self.accept_ratio <= 1.0:
            raise ValueError(f"accept_ratio must be in (0, 1], got {self.accept_ratio}")
        if self.min_accept < 1:
            raise ValueError(f"min_accept must be >= 1, got {self.min_accept}")
        if self.max_accept < 0:
            raise ValueError(f"max_accept must be >= 0 (0 = no cap), got {self.max_accept}")

    def accept_cap(self, masked: Tensor) -> Tensor:
        """(B,) most commits per row this step, from the (B,) masked counts of the block."""
        cap = torch.floor(masked * self.accept_ratio).long().clamp_min(self.min_accept)
        return cap.clamp_max(self.max_accept) if self.max_accept else masked

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        masked = inp.eligible.sum(-1)
        cap = self.accept_cap(masked)
        wide = inp.confidence > self.threshold
        commit = torch.where((wide.sum(-1) > cap).unsqueeze(-1), topk_mask(inp.confidence, cap), wide)
        # |A| as the loop will write it: a row whose bar nothing clears commits its best position
        accepted = torch.maximum(commit.sum(-1), inp.live.long())
        revisable = inp.revisable if inp.revisable is not None else torch.zeros_like(commit)
        current = inp.current if inp.current is not None else inp.candidates
        score = inp.probs.gather(-1, current.unsqueeze(-1)).squeeze(-1)
        failing = revisable & (score < self.threshold_back) & (accepted > 1).unsqueeze(-1)
        lowest_first = torch.where(failing, -score, NEG_INF)
        if self.reference_cap:
            last = state if state is not None and inp.step > 0 else torch.full_like(accepted, FIRST_LAST_ACCEPT)
            over = failing.sum(-1) >= last
            remask = torch.where(over.unsqueeze(-1), topk_mask(lowest_first, last - 1), failing)
        else:
            remask = topk_mask(lowest_first, accepted - 1)
        return Decision(commit=commit, remask=remask), accepted
