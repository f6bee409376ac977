"""Saber: adaptive acceleration with backtracking (arXiv 2510.18165)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import NEG_INF, topk_mask


@dataclass(frozen=True)
class SaberScheduler(Scheduler):
    """Commit above the running mean confidence-at-commit; take back the least-improved tokens.

    Saber (arXiv 2510.18165), per row and step:

    * commit every eligible position with c > tau, tau = the mean confidence at commit of the
      row's tokens committed so far (1.0 before any), and at least the `min_commit` (n = 2) most
      confident;
    * backtrack: among committed generated tokens before the block end (earlier blocks included),
      re-mask the k with the lowest change of their argmax probability since the previous step,
      dc = c_t - c_{t-1}, with k = max(n // 2, ceil(fix / mu)) capped at fix - 1 (fix: this step's
      commits; mu = 8), so every step leaves at least one mask fewer.

    Defaults n = 2, mu = 8; the paper decodes gen = block = 256 (no semi-autoregressive blocks:
    set `block_length = gen_length`). It takes back earlier blocks, so it runs without a KV cache
    (`revises = "generated"`). Fixes of the reference's pitfalls: tokens committed this step are
    not backtracking candidates (the reference compares them against a previous confidence of 0,
    so one of the first two commits was re-masked at once), and a re-masked token's confidence
    leaves the running mean. Deviations: the state follows the scheduler's own decision, not the
    loop's final one (the loop may still clamp re-masks or force progress); the loop's caps apply
    (at most `MAX_REVISIONS` per column, no 1024-iteration block cap needed). Like token editing,
    backtracking reads the model's predictions at committed positions, which a masked-diffusion
    model is not trained on.
    """

    revises: ClassVar[str] = "generated"

    min_commit: int = bounded(2, most=MAX_CANVAS, scales="memory")
    mu: int = bounded(8, most=MAX_CANVAS, scales="memory")

    def __post_init__(self) -> None:
        if self.min_commit < 1:
            raise ValueError(f"min_commit must be >= 1, got {self.min_commit}")
        if self.mu < 1:
            raise ValueError(f"mu must be >= 1, got {self.mu}")

    def init_state(self, batch_size: int, device: torch.device) -> Any:
        return None                          # built at the first step, when the generation length is known

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        # One column per position of the generation (a position is < its canvas column, so the
        # window's end bounds it without a host sync), plus a spare one that absorbs the rest.
        state = _widened(state, inp.offset + inp.is_masked.shape[1] + 1, inp)
        index, inside = _relative(inp, state["previous"].shape[1] - 1)
        argmax_p = inp.probs.max(-1).values
        at_commit = state["at_commit"].gather(1, index)
        committed = state["committed"].gather(1, index) & inside
        every = state["committed"][:, :-1]                 # the row's whole generation, not the window
        count = every.sum(-1)
        mean = torch.where(count > 0, (state["at_commit"][:, :-1] * every).sum(-1) / count.clamp_min(1), 1.0)
        commit = inp.confidence > mean.unsqueeze(-1)
        few = commit.sum(-1, keepdim=True) < self.min_commit
        commit = commit | (few & topk_mask(inp.confidence, torch.full_like(count, self.min_commit)))
        fix = (commit & inp.eligible).sum(-1)
        k = torch.minimum(torch.clamp(torch.ceil(fix / self.mu), min=self.min_commit // 2), fix - 1).clamp_min(0)
        gain = argmax_p - state["previous"].gather(1, index)
        candidates = inp.revisable & inside if inp.revisable is not None else torch.zeros_like(commit)
        remask = topk_mask(torch.where(candidates, -gain, NEG_INF), k.long())
        committed_now = (commit & inp.eligible) | (committed & ~remask)
        new_at_commit = torch.where(commit & inp.eligible, inp.confidence, at_commit)
        return Decision(commit=commit, remask=remask), {
            "previous": state["previous"].scatter(1, index, argmax_p),
            "at_commit": state["at_commit"].scatter(1, index, new_at_commit),
            "committed": state["committed"].scatter(1, index, committed_now),
        }


def _widened(state: dict[str, Tensor] | None, width: int, inp: StepInput) -> dict[str, Tensor]:
    """The state with at least `width` columns (new ones zero / uncommitted)."""
    if state is None:
        zeros = torch.zeros(inp.live.shape[0], width, device=inp.live.device)
        return {"previous": zeros, "at_commit": zeros.clone(), "committed": zeros.bool()}
    have = state["previous"].shape[1]
    if have >= width:
        return state
    # the old spare column moves to the end; the columns between are fresh
    return {k: torch.cat([v[:, :-1], v.new_zeros(v.shape[0], width - have), v[:, -1:]], 1)
            for k, v in state.items()}


def _relative(inp: StepInput, width: int) -> tuple[Tensor, Tensor]:
    """(B, W) index of each window column in the row's generation (column - generation start;
    columns outside it all map to the spare column `width`) and whether it lies inside.
    Relative, so a join that shifts the canvas columns keeps the state."""
    rel = inp.columns.unsqueeze(0) - inp.gen_span[:, :1]
    inside = (rel >= 0) & (rel < width)
    return torch.where(inside, rel, width), inside
