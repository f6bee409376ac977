"""Generation-order metrics of one decode, as arXiv 2601.15593 ("Parallelism and Generation
Order in Masked Diffusion Language Models") defines them.

- AFP (Average Finalization Parallelism) = n / T_eff: n positions, T_eff the number of distinct
  steps at which they were finalised. 1 is one token a step (autoregressive-like), n all at once.
- Kendall's tau between a position's index and the step that finalised it: 1 is strictly
  left-to-right, -1 right-to-left, near 0 no order.

Choices the definition leaves open, stated here: n is the sample's answer (positions before the
first end-of-text; the end-of-text padding after it is filled in one go and would inflate AFP),
or the whole canvas when the answer is empty; ties (several positions finalised in one step) use
tau-b, the tie-corrected form scipy's `kendalltau` computes by default; tau is None when fewer
than two positions or a single step (undefined).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class OrderStats:
    """One sample's generation-order figures (see the module doc)."""

    afp: float
    kendall_tau: float | None
    positions: int


def afp(finalized_at: Sequence[int]) -> float:
    """n / (number of distinct finalisation steps); 0.0 for no positions."""
    return len(finalized_at) / len(set(finalized_at)) if finalized_at else 0.0


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b of two equal-length sequences (None when either is constant or n < 2)."""
    n = len(x)
    if n != len(y):
        raise ValueError(f"kendall_tau_b needs equal lengths, got {n} and {len(y)}")
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return None if denominator == 0 else (concordant - discordant) / denominator


def order_stats(finalized_at: Sequence[int], answer_length: int) -> OrderStats:
    """AFP and Kendall's tau over the answer's positions (the whole canvas when it is empty)."""
    steps = list(finalized_at[:answer_length] if answer_length > 0 else finalized_at)
    return OrderStats(afp(steps), kendall_tau_b(range(len(steps)), steps), len(steps))


def finalization_steps(result: Any) -> Tensor:
    """(B, G) the step (1-based, per sample) whose write stayed at each canvas position, from a
    `DecodeResult` decoded with `trace=True`: its last commit or edit; a position the loop filled
    after the sample's last step (end-of-text padding after a stop, a truncation) counts as that
    last step, as `frames.sample_frames` shows it.

    Raises:
        ValueError: the result carries no trace.
    """
    if result.trace is None:
        raise ValueError("this result has no trace; decode with generate(..., trace=True)")
    rows_n, width = result.tokens.shape
    steps = torch.zeros(rows_n, dtype=torch.long)
    final = torch.zeros(rows_n, width, dtype=torch.long)
    written = torch.full((rows_n, width), -1, dtype=torch.long)
    for entry in result.trace:
        rows = entry["rows"].long()
        steps[rows] += 1
        window = entry["commit"].shape[1]
        lo, hi = max(0, entry["offset"]), min(width, entry["offset"] + window)
        if hi <= lo:
            continue
        part = slice(lo - entry["offset"], hi - entry["offset"])
        wrote = entry["commit"][:, part] | (entry["edit"][:, part] if "edit" in entry else False)
        taken = entry["remask"][:, part] if "remask" in entry else torch.zeros_like(wrote)
        now = steps[rows].unsqueeze(-1).expand_as(wrote)
        final[rows, lo:hi] = torch.where(wrote, now, torch.where(taken, 0, final[rows, lo:hi]))
        written[rows, lo:hi] = torch.where(wrote, entry["tokens"][:, part].long(),
                                           torch.where(taken, -1, written[rows, lo:hi]))
    filled = (final == 0) | (written != result.tokens.long())
    return torch.where(filled, steps.unsqueeze(-1).expand_as(final), final)


def result_order(result: Any) -> list[OrderStats]:
    """Each sample's `OrderStats` (AFP, Kendall's tau) of a traced `DecodeResult`."""
    steps = finalization_steps(result).tolist()
    return [order_stats(s, int(n)) for s, n in zip(steps, result.answer_lengths.tolist())]
