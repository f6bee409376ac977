"""Prophet: early commit ("all-in") once the answer has converged (Li et al., 2025, arXiv
2508.19982 v5, §4, Eq. 4-5, Alg. 1; code pixeli99/Prophet@460afe4 `generate_earlyexit.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import top2
from dllm_decode.schedulers.fixed_steps import LowConfidenceScheduler
from dllm_decode.schedulers.wrapper import Wrapper


@dataclass(frozen=True)
class EarlyCommitScheduler(Wrapper):
    """Finish a row in one step when the mean top-1/top-2 logit gap of its answer region is large.

    Each step, before the base's commit counts: gap_i = top1_logit_i - top2_logit_i (raw logit
    units, as the paper; probability margins are not comparable), g = mean gap over the answer
    region, progress p = share of the generation already decoded. The bar is `high` (7.5) while
    p < `early` (0.33), `mid` (5.0) while p < `late` (0.67), then `low` (2.5). When g >= bar the
    decision carries `finish`: the loop fills every masked column in view with the candidates
    (argmax when greedy) and the row stops. Otherwise `base` decides (any scheduler; default the
    reference's LLaDA low-confidence rule, one token per step).

    Answer region: `answer_start=None` (default, usable without constraints) takes the still
    masked generated positions in view before the first predicted end-of-text (the answer still
    to be written; the masked tail when only end-of-text padding is left). This asks "is the
    rest of the answer settled?", stricter than the paper's five positions, so it triggers later
    and mis-fires less; leaving out the padding matters, since its near-certain EOS predictions
    would dominate the mean and trigger all-in while the answer is still open.
    `answer_start=k` takes the `answer_length` (5) positions from generation offset k, as the
    reference (`answer_start = max(constraint_pos) + 2`). The paper's suffix anchor
    ("Answer:") is a prompt suffix here: end the prompt with it and set `answer_start=0`; the
    reference's mid-canvas constraint tokens need loop support dllm_decode does not have. A
    region entirely out of view (already decoded) falls back to the masked positions in view.

    Deviations: progress is the decoded share of the generation instead of step / T_max (equal
    when the base commits one token per step, the paper's setting; meaningful for parallel
    bases). The check is batch-safe (the reference reads batch row 0).

    Caches: the view is the rest of the canvas (no cache, prefix cache) so the answer region past
    the block is visible and all-in fills the whole generation. Under the dual cache only a
    block's first step (the refresh forward) sees the rest; its in-block steps see the block
    alone. There the gap is taken over the block's masked positions (an explicit region out of
    view falls back to them), all-in fills only that block, and the row stays triggered, so the
    next block's refresh step fills the rest: one extra forward compared with the paper.
    """

    base: Scheduler = field(default_factory=LowConfidenceScheduler)
    high: float = 7.5
    mid: float = 5.0
    low: float = 2.5
    early: float = 0.33
    late: float = 0.67
    answer_start: int | None = bounded(None, most=MAX_CANVAS, scales="memory")
    answer_length: int = bounded(5, most=MAX_CANVAS, scales="memory")

    view: ClassVar[str] = "rest"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.high >= self.mid >= self.low >= 0.0:
            raise ValueError(f"thresholds must satisfy high >= mid >= low >= 0, got "
                             f"{self.high}, {self.mid}, {self.low}")
        if not 0.0 < self.early <= self.late <= 1.0:
            raise ValueError(f"progress cuts must satisfy 0 < early <= late <= 1, got "
                             f"{self.early}, {self.late}")
        if self.answer_start is not None and self.answer_start < 0:
            raise ValueError(f"answer_start must be >= 0 or None, got {self.answer_start}")
        if self.answer_length < 1:
            raise ValueError(f"answer_length must be >= 1, got {self.answer_length}")

    def own_state(self, batch_size: int, device: torch.device) -> dict[str, Any]:
        return {"triggered": torch.zeros(batch_size, dtype=torch.bool, device=device)}

    def select(self, inp: StepInput, state: dict[str, Any]) -> tuple[Decision, dict[str, Any]]:
        trigger = (self.mean_gap(inp) >= self.bar(inp)) | state["triggered"]
        trigger = trigger & inp.live
        decision, state = super().select(inp, state)
        finish = trigger if decision.finish is None else decision.finish | trigger
        return dataclasses.replace(decision, finish=finish), {**state, "triggered": state["triggered"] | trigger}

    def region(self, inp: StepInput) -> Tensor:
        """(B, W) bool answer-region columns in view."""
        cols = inp.columns
        gen_start, gen_end = inp.gen_span[:, :1], inp.gen_span[:, 1:]
        masked = inp.is_masked & (cols >= gen_start) & (cols < gen_end)
        if self.answer_start is None:
            eos = torch.tensor(inp.eos_ids, dtype=torch.long, device=cols.device)
            ends = torch.isin(inp.candidates, eos) & (cols >= gen_start)
            first_end = torch.where(ends, cols, gen_end).min(-1, keepdim=True).values
            answer = masked & (cols < first_end)
            return torch.where(answer.any(-1, keepdim=True), answer, masked)
        first = gen_start + self.answer_start
        fixed = (cols >= first) & (cols < first + self.answer_length) & (cols < gen_end)
        return torch.where(fixed.any(-1, keepdim=True), fixed, masked)

    def mean_gap(self, inp: StepInput) -> Tensor:
        """(B,) mean top-1 minus top-2 logit over the region; -inf for an empty region."""
        first, second = top2(inp.logits)
        region = self.region(inp)
        count = region.sum(-1)
        total = torch.where(region, first - second, 0.0).sum(-1)
        return torch.where(count > 0, total / count.clamp_min(1), float("-inf"))

    def bar(self, inp: StepInput) -> Tensor:
        """(B,) the staged threshold at the row's progress (share of the generation decoded)."""
        cols = inp.columns
        gen_start, gen_end = inp.gen_span[:, 0], inp.gen_span[:, 1]
        in_gen = (cols >= gen_start.unsqueeze(-1)) & (cols < gen_end.unsqueeze(-1))
        past_view = (gen_end - (inp.offset + cols.shape[0])).clamp_min(0)  # never decoded yet
        length = (gen_end - gen_start).clamp_min(1)
        decoded = length - (inp.is_masked & in_gen).sum(-1) - past_view
        progress = decoded.double() / length.double()      # float64: cuts like 33/100 compare exactly
        return torch.where(progress < self.early, self.high,
                           torch.where(progress < self.late, self.mid, self.low))
