"""Vectorised helpers shared by the loop and the schedulers. No host syncs, no batch loops."""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")


def topk_mask(scores: Tensor, k: Tensor) -> Tensor:
    """(B, W) scores, (B,) counts -> (B, W) bool with the k[b] largest scores of row b set.

    Ties go to the lower column (stable sort), so runs repeat exactly. Entries scored -inf are
    never selected, even when k exceeds the number of finite scores.
    """
    order = scores.argsort(dim=-1, descending=True, stable=True)
    # rank of each column = the inverse permutation of `order` (one sort and a scatter, not two sorts)
    positions = torch.arange(scores.shape[-1], device=scores.device).expand_as(order)
    ranks = torch.empty_like(order).scatter_(-1, order, positions)
    return (ranks < k.unsqueeze(-1)) & (scores > NEG_INF)


def argmax_mask(scores: Tensor) -> Tensor:
    """(B, W) -> (B, W) bool marking each row's largest finite score (none for an all -inf row).

    Same as `topk_mask(scores, 1)` (ties to the lower column: `argmax` returns the first maximum)
    without a sort.
    """
    if scores.shape[-1] == 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    columns = torch.arange(scores.shape[-1], device=scores.device)
    return (columns == scores.argmax(dim=-1, keepdim=True)) & (scores > NEG_INF)


def gumbel_argmax(logits: Tensor, temperature: float, generator: torch.Generator | None,
                  region: tuple[Tensor, int, int] | None = None, uniform: Tensor | None = None) -> Tensor:
    """Sampled token per position: argmax(logits + T * Gumbel), drawn in float64.

    Same as LLaDA's `exp(logits) / (-log u)^T` (low precision Gumbel hurts quality,
    arXiv 2409.02908). T = 0 is plain argmax. With `region = (start, span, offset)` the noise is
    drawn only for each row's columns `[start, start + span)` (`aligned_uniform`; argmax
    elsewhere), so a row's draws do not depend on the window the batch happens to need.
    `uniform`: those U(0, 1) draws made beforehand (the captured step's host side).
    """
    noise = gumbel_noise(logits, temperature, generator, region, uniform)
    return logits.argmax(dim=-1) if noise is None else (logits.double() + noise).argmax(dim=-1)


def gumbel_noise(logits: Tensor, temperature: float, generator: torch.Generator | None,
                 region: tuple[Tensor, int, int] | None = None,
                 uniform: Tensor | None = None) -> Tensor | None:
    """The (B, W, V) float64 noise `temperature * Gumbel` that `gumbel_argmax` adds to `logits`
    (0 outside `region`), or None at temperature 0. `uniform`: the (B, W, V) U(0, 1) draws,
    made beforehand (NaN: no noise), instead of drawing them here."""
    if temperature == 0:
        return None
    if uniform is not None:
        u = uniform
    elif region is None:
        u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    else:
        start, span, offset = region
        u = aligned_uniform(start, span, offset, logits.shape[1], generator, vocab=logits.shape[-1],
                            dtype=torch.float64)
    gumbel = (-torch.log(-torch.log(u.clamp_min(1e-300)))).nan_to_num(0.0)   # NaN: outside, no noise
    return temperature * gumbel


def aligned_uniform(start: Tensor, span: int, offset: int, width: int,
                    generator: torch.Generator | None, vocab: int | None = None,
                    dtype: torch.dtype = torch.float32) -> Tensor:
    """U(0, 1) draws for each row's canvas columns `[start, start + span)`, laid into a window of
    `width` columns that starts at canvas column `offset`; NaN elsewhere.

    The draws are made for the regions themselves ((B, span) or (B, span, V)), so what a row
    draws depends only on its region and its generator, not on the window the batch needs: a
    request decodes the same alone and in a busy batch, sampling included. No host sync.
    """
    span = max(span, 1)
    tail = () if vocab is None else (vocab,)
    draws = torch.rand((start.shape[0], span, *tail), dtype=dtype, device=start.device, generator=generator)
    index = torch.arange(width, device=start.device) + offset - start.unsqueeze(-1)     # (B, W)
    inside = (index >= 0) & (index < span)
    index = index.clamp(0, span - 1)
    if vocab is not None:
        index, inside = index.unsqueeze(-1).expand(-1, -1, vocab), inside.unsqueeze(-1)
    return draws.gather(1, index).masked_fill(~inside, float("nan"))


def top2(values: Tensor) -> tuple[Tensor, Tensor]:
    """(…, V) -> the largest and second largest value along the last axis."""
    best = values.topk(2, dim=-1).values
    return best[..., 0], best[..., 1]


def neg_entropy(probs: Tensor) -> Tensor:
    """(…, V) probabilities -> sum p log p (0 log 0 = 0), Dream's `entropy` score."""
    return (probs * probs.clamp_min(1e-30).log()).sum(-1)


def masked_scores(scores: Tensor, eligible: Tensor) -> Tensor:
    """Scores where eligible, -inf elsewhere (what selection rules sort)."""
    return scores.masked_fill(~eligible, NEG_INF)


def tokens_per_step(num_masked: Tensor, steps_left: Tensor) -> Tensor:
    """LLaDA's schedule: commit ceil-front-loaded shares so `num_masked` finishes in `steps_left`.

    With M masked and K steps left, step k commits floor(M/K) + (k < M mod K); at the current step
    that is ceil(M / K) (LLaDA `get_num_transfer_tokens`, recomputed each step so rows that were
    forced forward stay on schedule).
    """
    steps_left = steps_left.clamp_min(1)
    return (num_masked + steps_left - 1) // steps_left
