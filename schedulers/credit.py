"""CreditDecoding: trace credits fused into the logits (Wang et al., 2025, arXiv 2510.06133, §3;
reference implementation: dInfer's `CreditThresholdParallelDecoder`,
inclusionAI/dInfer@fce4e32 python/dinfer/decoding/parallel_strategy.py)."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.interfaces import Scheduler, StepInput
from dllm_decode.schedulers.columns import carry
from dllm_decode.schedulers.threshold import ThresholdScheduler
from dllm_decode.schedulers.wrapper import Wrapper


@dataclass(frozen=True)
class CreditScheduler(Wrapper):
    """Accumulate credit for each position's top-1 token and fuse it into the logits.

    Each step, for every masked position i in view with top-1 token v and probability p:

        C_i <- beta * C_i            (all entries; C starts empty at each block's first step)
        C_i[v] <- C_i[v] + p ** gamma
        fused_i = logits_i + alpha * log(1 + C_i)

    The step's own evidence is added before fusion, so even the first step boosts the top-1 odds
    by (1 + p^gamma)^alpha. The loop recomputes candidates and confidences from the fused logits,
    so credit can change which token is committed, not only when; `base` (any scheduler, default
    the threshold rule at 0.8, dInfer's setting with credit) then selects on the fused view.

    State: sparse and exact. Credit only ever goes to top-1 tokens, so each position holds at
    most one (token, credit) slot per step of its block, keyed by absolute canvas column (it
    survives window moves and uneven AdaBlock blocks) and dropped at each block start; no
    vocabulary-sized tensor is stored. A new request starts empty (`init_state`), fixing dInfer's
    leak of block-keyed tensors across requests that end with masks left.

    Deviations: dInfer credits only the active block; here every masked position in view gains
    credit (identical for the plain block view; under a wide view, e.g. wrapped by Prophet,
    positions past the block see credited logits too, and still restart from zero when their own
    block begins). The paper's parameter-free variant (gamma = 1, alpha_t = beta_t = 1 - mask
    ratio) is not implemented. Defaults alpha = 0.7, beta = 0.8, gamma = 0.2 (dInfer).
    """

    base: Scheduler = field(default_factory=functools.partial(ThresholdScheduler, threshold=0.8))
    alpha: float = 0.7
    beta: float = 0.8
    gamma: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0.0 <= self.alpha and math.isfinite(self.alpha)):
            raise ValueError(f"alpha must be a finite value >= 0, got {self.alpha}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {self.beta}")
        if not (0.0 <= self.gamma and math.isfinite(self.gamma)):
            raise ValueError(f"gamma must be a finite value >= 0, got {self.gamma}")

    def own_state(self, batch_size: int, device: torch.device) -> dict[str, Any]:
        return {"start": torch.zeros(batch_size, dtype=torch.long, device=device),
                "tokens": torch.zeros(batch_size, 0, 0, dtype=torch.long, device=device),
                "credit": torch.zeros(batch_size, 0, 0, device=device)}

    def process_logits(self, inp: StepInput, state: dict[str, Any]) -> tuple[Tensor | None, dict[str, Any]]:
        tokens, credit = self._accumulate(inp, state)
        dense = torch.zeros_like(inp.logits).scatter_add_(-1, tokens.clamp_min(0), credit)
        fused = inp.logits + self.alpha * torch.log1p(dense)
        state = {**state, "start": torch.full_like(state["start"], inp.offset),
                 "tokens": tokens, "credit": credit}
        fused_view = dataclasses.replace(inp, logits=fused, probs=fused.softmax(-1))
        more, state = super().process_logits(fused_view, state)
        return (fused if more is None else more), state

    def _accumulate(self, inp: StepInput, state: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """(B, W, S) token ids (-1 = empty slot) and credits after this step's update."""
        batch, width = inp.is_masked.shape
        columns = inp.columns.expand(batch, width)
        if inp.step == 0:                                # a new block: credit starts empty
            tokens = torch.zeros(batch, width, 0, dtype=torch.long, device=columns.device)
            credit = torch.zeros(batch, width, 0, device=columns.device)
        else:
            tokens = carry(state["tokens"], state["start"], columns, -1)
            credit = carry(state["credit"], state["start"], columns, 0.0) * self.beta
        top_p, top_v = inp.probs.max(-1)
        active = inp.is_masked & inp.live.unsqueeze(-1)
        boost = torch.where(active, top_p.clamp_min(0) ** self.gamma, 0.0)
        match = tokens == top_v.unsqueeze(-1)
        credit = credit + match * boost.unsqueeze(-1)
        fresh = active & ~match.any(-1)                  # top-1 token not yet held: a new slot
        tokens = torch.cat([tokens, torch.where(fresh, top_v, -1).unsqueeze(-1)], -1)
        credit = torch.cat([credit, torch.where(fresh, boost, 0.0).unsqueeze(-1)], -1)
        return tokens, credit
