"""The Info-Gain sampler: propose, score by one-step look-ahead, commit (arXiv 2602.18176, ICML
2026; reference `yks23/Information-Gain-Sampler`, read through its port in `ZHZisZZ/dllm`,
`dllm/pipelines/infogain`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.fields import bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import argmax_mask, neg_entropy
from dllm_decode.schedulers.draws import row_uniform

VARIANTS = ("info_gain", "lookum")
COSTS = ("sum", "mean")
SCOPES = ("canvas", "block")


@dataclass(frozen=True)
class InfoGainScheduler(Scheduler):
    """Commit the candidate action that leaves the canvas least uncertain one step ahead.

    Per row and step (one position per action, the reference's k = 1):

    * bypass: if `bypass_threshold` > 0 and every masked column of the block has max_v p >=
      `bypass_threshold`, commit them all (no look-ahead);
    * trivial path (no look-ahead): one eligible column, `candidates` <= 1 or
      `position_temperature` <= 0: commit the most confident column;
    * otherwise propose `candidates` actions: candidate 0 the most confident column, candidate
      c >= 1 the column `argmax(c_i / position_temperature + Gumbel_i)`; duplicates are dropped
      (the first occurrence wins). The loop runs ONE look-ahead forward over the candidate
      canvases (the row's canvas with the action written) and hands back their entropies;
    * score J_c = -cost_weight * C_c - future_weight * H_next,c, where C_c is the sum (or mean)
      of the entropies H_i (nats) at the action's columns, and H_next,c the mean entropy over
      the masked columns of candidate canvas c (every later block too, `future_scope =
      "canvas"`, the reference; or the active block only, "block"). The `lookum` variant drops
      the cost term. Commit the best action; ties go to the first (candidate 0, the greedy one).

    Defaults are the documented runs' (`candidates = 8`, `position_temperature = 0.2`,
    `bypass_threshold = 0.8`, sum cost, both weights 1); the port's config default for the
    bypass is None (0 here disables it). The look-ahead forward is counted: one more NFE for
    every row that proposed candidates, and one forward row per candidate (`forward_rows`). It
    needs exact logits for the whole canvas each step, so the rule runs under cache `none` only,
    or `block` on a block-diffusion model (exact there); the reference's cached path runs
    Fast-dLLM instead of Info-Gain.

    Deviations: every candidate writes the loop's candidate tokens (the reference draws each
    candidate's tokens with its own Gumbel noise at T > 0; at T = 0, the documented setting, the
    two are identical); the look-ahead is one batched call for every row (the port loops over
    rows); positions' Gumbel noise comes from `draws.row_uniform`, so a batch decodes exactly
    as its rows alone (a draw per row would depend on the batch). The
    reference's chosen look-ahead is not reused as the next step's forward (neither does the
    port). A view without look-ahead entropies (a tool that runs no extra forwards) gets
    candidate 0, the confidence rule.
    """

    caches: ClassVar[tuple[str, ...] | None] = ("none", "block")

    candidates: int = bounded(8, most=64, scales="rows")
    position_temperature: float = 0.2
    bypass_threshold: float = 0.8
    variant: str = "info_gain"
    cost: str = "sum"
    cost_weight: float = 1.0
    future_weight: float = 1.0
    future_scope: str = "canvas"

    def __post_init__(self) -> None:
        if self.candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {self.candidates}")
        if self.position_temperature < 0:
            raise ValueError(f"position_temperature must be >= 0, got {self.position_temperature}")
        if not 0.0 <= self.bypass_threshold <= 1.0:
            raise ValueError(f"bypass_threshold must be in [0, 1] (0: no bypass), "
                             f"got {self.bypass_threshold}")
        for name, value, accepted in (("variant", self.variant, VARIANTS), ("cost", self.cost, COSTS),
                                      ("future_scope", self.future_scope, SCOPES)):
            if value not in accepted:
                raise ValueError(f"{name} must be one of {list(accepted)}, got {value!r}")
        if self.cost_weight < 0 or self.future_weight < 0:
            raise ValueError(f"cost_weight and future_weight must be >= 0, got "
                             f"{self.cost_weight}, {self.future_weight}")

    @property
    def lookahead_candidates(self) -> int:                   # type: ignore[override]
        return self.candidates if self.candidates > 1 and self.position_temperature > 0 else 0

    def _paths(self, inp: StepInput) -> tuple[Tensor, Tensor]:
        """(B,) rows that take the bypass, and rows that take the look-ahead."""
        bypass = torch.zeros_like(inp.live)
        if self.bypass_threshold > 0:
            sure = inp.probs.max(-1).values >= self.bypass_threshold
            bypass = inp.live & (sure | ~inp.eligible).all(-1)
        look = ~bypass & (inp.eligible.sum(-1) > 1) & (self.lookahead_candidates > 0)
        return bypass, look

    def lookahead(self, inp: StepInput, state: Any) -> tuple[Tensor, Tensor, Any]:
        _, look = self._paths(inp)
        n, width = self.candidates, inp.eligible.shape[1]
        greedy = argmax_mask(inp.confidence)
        gumbel = -torch.log(-torch.log(row_uniform(inp, n - 1)))
        scores = inp.confidence.unsqueeze(1) / self.position_temperature + gumbel     # -inf stays
        sampled = scores.argmax(-1)                                                  # (B, N-1)
        positions = torch.cat([greedy.int().argmax(-1, keepdim=True), sampled], 1)   # (B, N)
        first = (positions.unsqueeze(-1) == positions.unsqueeze(-2)).int().argmax(-1)
        unique = first == torch.arange(n, device=positions.device)
        actions = torch.nn.functional.one_hot(positions, width).bool()
        actions = actions & (unique & look.unsqueeze(-1)).unsqueeze(-1) & inp.eligible.unsqueeze(1)
        return actions, inp.candidates.unsqueeze(1).expand(-1, n, -1), {"actions": actions}

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        bypass, _ = self._paths(inp)
        commit = argmax_mask(inp.confidence)
        actions = state.get("actions") if isinstance(state, dict) else None
        if actions is not None and inp.lookahead_entropy is not None:
            entropy = -neg_entropy(inp.probs)                                     # (B, W)
            size = actions.sum(-1).clamp_min(1)
            cost = (actions * entropy.unsqueeze(1)).sum(-1)
            cost = cost / size if self.cost == "mean" else cost
            ahead = inp.lookahead_entropy
            if self.future_scope == "block":
                inside = (inp.columns < inp.block[:, 1:]).float()                  # (B, W)
                ahead = ahead[..., :inside.shape[1]].masked_fill(inside.unsqueeze(1) == 0, float("inf"))
            known = torch.isfinite(ahead)
            future = torch.where(known, ahead, 0.0).sum(-1) / known.sum(-1).clamp_min(1)
            score = -self.future_weight * future
            if self.variant == "info_gain":
                score = score - self.cost_weight * cost
            score = score.masked_fill(~actions.any(-1), float("-inf"))            # (B, N)
            best = score.argmax(-1)
            chosen = actions.gather(1, best.view(-1, 1, 1).expand(-1, 1, actions.shape[-1])).squeeze(1)
            commit = torch.where(actions.any((1, 2)).unsqueeze(-1), chosen, commit)
        commit = torch.where(bypass.unsqueeze(-1), inp.eligible, commit)
        return Decision(commit=commit), None

