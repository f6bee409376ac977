"""DUS: the dilated unmasking scheduler (Luxembourg et al., 2025, arXiv 2506.19037; code
`omerlux/DUS` `generate.py`, `generate_scheduled`, `dilated_unmask_levels`, `merge_last_level`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import argmax_mask, masked_scores, topk_mask

ORDERS = ("schedule", "confidence")


def dilated_levels(length: int, base: int = 2, skip_exp: int = 1) -> list[list[int]]:
    """DUS's planner-free schedule of one block: the offsets 0..length-1 in groups, one per step.

    Strides length // base**skip_exp, then each stride divided by `base` down to 1; each level is
    the offsets divisible by its stride not taken before; leftovers form a last level, and a last
    level smaller than the one before it is folded into it (`merge_last_level`). base 1 is one
    group. For powers of the base (>= 4) every group is non-adjacent: 32 -> sizes 2, 2, 4, 8, 16.
    """
    if length <= 0:
        return []
    if base == 1:
        return [list(range(length))]
    levels: list[list[int]] = []
    seen: set[int] = set()
    stride = length // base ** skip_exp
    while stride >= 1:
        group = [o for o in range(length) if o % stride == 0 and o not in seen]
        if group:
            levels.append(group)
            seen.update(group)
        stride //= base
    rest = [o for o in range(length) if o not in seen]
    if rest:
        levels.append(rest)
    if len(levels) >= 2 and len(levels[-1]) < len(levels[-2]):
        last = levels.pop()
        levels[-1] = sorted(levels[-1] + last)
    return levels


@functools.lru_cache(maxsize=64)
def _tables(max_length: int, base: int, skip_exp: int, device: str) -> tuple[Tensor, Tensor, Tensor]:
    """For every block length 0..max_length: the level of each offset (padded with a large id),
    the number of levels, and each level's size."""
    level = torch.full((max_length + 1, max_length), max_length + 1, dtype=torch.long)
    count = torch.zeros(max_length + 1, dtype=torch.long)
    sizes = torch.zeros(max_length + 1, max_length + 1, dtype=torch.long)
    for length in range(1, max_length + 1):
        levels = dilated_levels(length, base, skip_exp)
        count[length] = len(levels)
        for k, group in enumerate(levels):
            level[length, group] = k
            sizes[length, k] = len(group)
    return level.to(device), count.to(device), sizes.to(device)


@dataclass(frozen=True)
class DUSScheduler(Scheduler):
    """Commit the block in DUS's dilated groups, one group per step (log-many forwards per block).

    Step k of a block works on level k of `dilated_levels(block length, base, skip_exp)`. With
    `order="schedule"` (the reference's `generate_scheduled`) the due columns are the still-masked
    ones of levels <= k; those with confidence >= `remask_threshold` commit (ties pass: the
    reference re-masks on `<`), and at the last level all due columns commit, so every block ends
    in exactly its number of levels. With `order="confidence"` (the reference's
    `n_transfer='inc_dilated'`) only the level sizes are used: commit the top-|level k| eligible
    columns by confidence, everything at the last level.

    Defaults: base 2, skip_exp 1, remask_threshold 0.3 (README and ParallelBench's port); DUS's
    speed knob is the block length (a `DecodeConfig` field: ParallelBench sweeps 1..32), where
    block 1 is one token per step left to right and base 1 commits the whole block in one step.

    Deviations, fixing the reference's pitfalls: a position deferred (re-masked) at a level joins
    the next level's due set (in the reference it is never scheduled again and stays [MASK] to the
    end); when no due column passes the bar at a non-final level, the most confident due column
    commits (the reference spends the forward and commits nothing); confidence is the clean
    float32 softmax (the reference's is of Gumbel-noised exponentials at T > 0); no
    `high_entropy` mode (its test is inverted); the `binary` midpoint schedule is not ported.
    Stateless: the level is the block step; the block length is read per row each step (a block
    shortened by end-of-text truncation is rescheduled from its new length).
    """

    canvas_kinds: ClassVar[tuple[str, ...]] = ("mask", "noise")   # its rule reads only the step's view

    base: int = bounded(2, most=MAX_CANVAS, scales="memory")
    skip_exp: int = bounded(1, most=64, scales="steps")
    remask_threshold: float = 0.3
    order: str = "schedule"

    def __post_init__(self) -> None:
        if self.base < 1:
            raise ValueError(f"base must be >= 1, got {self.base}")
        if self.skip_exp < 1:
            raise ValueError(f"skip_exp must be >= 1, got {self.skip_exp}")
        if not 0.0 <= self.remask_threshold <= 1.0:
            raise ValueError(f"remask_threshold must be in [0, 1] (0 defers nothing), got {self.remask_threshold}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        width = inp.eligible.shape[1]
        longest = max(width, inp.num_steps)
        level, count, sizes = _tables(longest, self.base, self.skip_exp, str(inp.eligible.device))
        length = (inp.block[:, 1] - inp.block[:, 0]).clamp(0, longest)                # (B,)
        offset = (inp.columns - inp.block[:, :1]).clamp(0, longest - 1)              # (B, W)
        column_level = level[length].gather(1, offset)
        current = torch.minimum(torch.full_like(length, inp.step), (count[length] - 1).clamp_min(0))
        final = (current >= count[length] - 1).unsqueeze(-1)
        if self.order == "confidence":
            k = torch.where(final.squeeze(-1), length, sizes[length].gather(1, current.unsqueeze(-1)).squeeze(-1))
            return Decision(commit=topk_mask(inp.confidence, k)), state
        due = inp.eligible & (column_level <= current.unsqueeze(-1))
        passing = due & (final | (inp.confidence >= self.remask_threshold))
        stalled = due.any(-1, keepdim=True) & ~passing.any(-1, keepdim=True)
        forced = argmax_mask(masked_scores(inp.confidence, due)) & stalled
        return Decision(commit=passing | forced), state
