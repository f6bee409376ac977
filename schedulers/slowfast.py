"""SlowFast sampling (2025, arXiv 2506.10848; code `LiangrunFlora/Slow-Fast-Sampling`
`slow-fast-sampling/sampling_utils/generate_slow_fast_sampling.py`, `generate_slow_fast_sampling`)."""

from __future__ import annotations

from typing import ClassVar

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.fields import bounded, check_probability
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import argmax_mask, masked_scores

SLOW, FAST = 0, 1


@dataclass(frozen=True)
class SlowFastScheduler(Scheduler):
    """Alternate a slow phase that explores how far ahead the model is sure with a fast phase that
    fills that span in parallel.

    Each block runs sub-cycles from L_prev (0 at the block start). The slow phase takes
    `explore_steps` steps over the scope [L_prev, block end): each step estimates the span end
    est = clamp(L_prev + (max{o : c_o >= span_threshold} - L_prev) + 1, 1, block length) (one past
    L_prev when nothing passes), keeps the last `stability_window` estimates, and once the window
    is full fixes L_cur = est when their population std is < `stability_std` (window 2, std 1:
    two consecutive estimates at most 1 apart), else the integer mean (fixed at the last slow
    step; the integer mean of the history, or half the block, if never fixed). The fast phase then
    commits only inside [L_prev, L_cur) until it has no mask, and the next sub-cycle starts at
    L_cur. Every step, in both phases, commits the positions of its scope with c >= high_threshold
    when there are more than one, else the scope's most confident one. Ties pass both bars; the
    stability test is strict.

    Defaults are the code's: explore_steps 6, span_threshold 0.3, stability_window 2,
    stability_std 1.0, high_threshold 0.9 (ParallelBench's port sweeps high_threshold 0.5..1.0 at
    span 0.3). Secondary notes quote 0.1 / 8 / 0.85, possibly the paper's ablation settings.

    Deviations: a block ends as soon as it has no mask, so the reference's slow forwards over an
    empty scope (always `explore_steps` of them, counted in its NFE) never run: NFE can be lower
    than the reference's on the same inputs. The reference's fast phase truncates the canvas after
    the span and reuses its first fast forward's logits for the columns after it (an input change,
    one forward per batch row); that reuse is not part of this rule: combine with `--cache suffix`
    for a similar cost profile. The history restarts with each sub-cycle. Confidence is the clean
    float32 softmax (the reference's is in the model dtype). Batched with per-row phases; no
    Python loop over rows.
    """

    canvas_kinds: ClassVar[tuple[str, ...]] = ("mask", "noise")   # its rule reads only the step's view

    explore_steps: int = bounded(6, most=4096, scales="steps")
    span_threshold: float = 0.3
    stability_window: int = bounded(2, most=4096, scales="memory")
    stability_std: float = 1.0
    high_threshold: float = 0.9
    infinite_ok = ("high_threshold",)      # inf: never fill in parallel

    def __post_init__(self) -> None:
        if self.explore_steps < 1:
            raise ValueError(f"explore_steps must be >= 1, got {self.explore_steps}")
        if not 0.0 <= self.span_threshold <= 1.0:
            raise ValueError(f"span_threshold must be in [0, 1], got {self.span_threshold}")
        if self.stability_window < 1:
            raise ValueError(f"stability_window must be >= 1, got {self.stability_window}")
        if math.isnan(self.stability_std) or self.stability_std < 0.0:
            raise ValueError(f"stability_std must be >= 0, got {self.stability_std}")
        check_probability(self, "high_threshold", infinite_ok=True)    # inf: never fill in parallel

    def init_state(self, batch_size: int, device: torch.device) -> dict[str, Tensor]:
        zeros = torch.zeros(batch_size, dtype=torch.long, device=device)
        return {"phase": zeros, "start": zeros, "end": zeros, "slow_step": zeros, "count": zeros,
                "determined": zeros.bool(),
                "history": torch.zeros(batch_size, self.stability_window, dtype=torch.float64, device=device)}

    def select(self, inp: StepInput, state: dict[str, Tensor]) -> tuple[Decision, dict[str, Tensor]]:
        if inp.step == 0:
            state = self.init_state(inp.live.shape[0], inp.live.device)
        live = inp.live
        length = inp.block[:, 1] - inp.block[:, 0]
        offset = inp.columns - inp.block[:, :1]                                 # (B, W)
        start, end, history = state["start"], state["end"], state["history"]
        slow = (state["phase"] == SLOW) & live
        scope = inp.eligible & (offset >= start.unsqueeze(-1))
        span = inp.eligible & (offset >= start.unsqueeze(-1)) & (offset < end.unsqueeze(-1))
        area = torch.where(slow.unsqueeze(-1), scope, span)

        # slow phase: estimate the span end while it is not fixed
        explore = slow & ~state["determined"]
        passing = torch.where(scope & (inp.confidence >= self.span_threshold), offset, -1).amax(-1)
        increment = torch.where(passing >= 0, passing - start + 1, 1)
        estimate = torch.minimum(torch.maximum(start + increment, torch.ones_like(start)), length)
        pushed = torch.cat([history[:, 1:], estimate.unsqueeze(-1).double()], -1)
        history = torch.where(explore.unsqueeze(-1), pushed, history)
        count = torch.where(explore, (state["count"] + 1).clamp_max(self.stability_window), state["count"])
        full = explore & (count >= self.stability_window)
        stable = full & (history.std(-1, unbiased=False) < self.stability_std)
        last = state["slow_step"] >= self.explore_steps - 1
        mean = history.mean(-1).floor().long()
        end = torch.where(stable, estimate, torch.where(full, mean, end))
        determined = state["determined"] | stable | (full & last)

        # fill: every high-confidence position of the scope if more than one, else its best
        high = area & (inp.confidence >= self.high_threshold)
        best = argmax_mask(masked_scores(inp.confidence, area))
        commit = torch.where((high.sum(-1) > 1).unsqueeze(-1), high, best)

        # phase changes
        slow_step = torch.where(slow, state["slow_step"] + 1, state["slow_step"])
        to_fast = slow & (slow_step >= self.explore_steps)
        kept = torch.arange(self.stability_window, device=count.device) >= (self.stability_window - count).unsqueeze(-1)
        fallback = torch.where(count > 0, (torch.where(kept, history, 0.0).sum(-1) / count.clamp_min(1)).floor().long(),
                               length // 2)
        end = torch.where(to_fast & ~determined, fallback, end)
        phase = torch.where(to_fast, FAST, state["phase"])
        in_span = (offset >= start.unsqueeze(-1)) & (offset < end.unsqueeze(-1))
        span_done = (phase == FAST) & live & ~(inp.eligible & ~commit & in_span).any(-1)
        new = {"phase": torch.where(span_done, SLOW, phase), "start": torch.where(span_done, end, start),
               "end": end, "slow_step": torch.where(span_done, 0, slow_step),
               "count": torch.where(span_done, 0, count), "determined": determined & ~span_done,
               "history": history}
        return Decision(commit=commit), new
