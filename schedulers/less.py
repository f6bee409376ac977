"""LESS: mutual-stability sampling, token commitment as online stopping (Mohamed, Shang and
Vazirgiannis, 2026, arXiv 2606.16908). Only the abstract could be read; no code was found."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.fields import bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.schedulers.columns import carry
from dllm_decode.schedulers.fixed_steps import LowConfidenceScheduler
from dllm_decode.schedulers.klass import ready_or_fallback
from dllm_decode.schedulers.wrapper import Wrapper


def _half_kl_terms(a: Tensor, b: Tensor) -> Tensor:
    """½ a ln(a/m) + ½ b ln(b/m) with m = (a + b) / 2 and 0 ln 0 = 0 (one JS term per entry)."""
    m = (a + b) / 2
    safe = m.clamp_min(1e-30)
    left = torch.where(a > 0, a * (a.clamp_min(1e-30) / safe).log(), 0.0)
    right = torch.where(b > 0, b * (b.clamp_min(1e-30) / safe).log(), 0.0)
    return (left + right) / 2


def topk_js(ids_p: Tensor, p: Tensor, ids_q: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence (nats) between two distributions known by their top-K.

    Each distribution is its top-K entries plus one "other" bucket holding its remaining mass;
    the divergence is taken over the union of the two top-K id sets plus that shared bucket.
    Symmetric, 0 for identical inputs, at most ln 2. Shapes (..., K) for ids and probabilities.
    """
    same = ids_p.unsqueeze(-1) == ids_q.unsqueeze(-2)                      # (..., K, K)
    q_at_p = (same * q.unsqueeze(-2)).sum(-1)
    q_only = q * ~same.any(-2)                                               # q's ids p lacks
    other = _half_kl_terms((1 - p.sum(-1)).clamp_min(0), (1 - q.sum(-1)).clamp_min(0))
    return _half_kl_terms(p, q_at_p).sum(-1) + _half_kl_terms(torch.zeros_like(q_only), q_only).sum(-1) + other


@dataclass(frozen=True)
class LESSScheduler(Wrapper):
    """Commit the positions that are confident, whose top-1 has persisted and whose top-K
    distribution is stable between steps; when none is, defer to `base`.

    ready_i = eligible, c_i > `confidence` (strict), the top-1 id unchanged for the last
    `persistence` steps (this one included; a flip restarts the count at 1), and the top-K
    Jensen-Shannon divergence to the previous step's distribution < `js_threshold` nats (strict;
    `topk_js`: union of both top-K id sets plus one bucket for the rest). A row with ready
    positions commits all of them; a row with none commits what `base` decides (default LLaDA
    low-confidence, one token per step). A position has no history in its block's first step, so
    it is never ready there.

    PROVISIONAL: only the abstract was read ("eligible only when its top-1 prediction has high
    confidence, its top-1 token has persisted across recent reverse steps, and its predictive
    distribution is stable under top-K inter-step Jensen-Shannon divergence"). Every default
    (confidence 0.9, persistence 2, top_k 8, js 0.01), the JS construction over top-K, the tie
    rules and the fallback are this project's choices, modelled on KLASS, until the paper's
    method section can be checked. The paper reports 72.1% fewer reverse steps than fixed-budget
    decoding on Dream-7B, LLaDA-8B and LLaDA-1.5 (abstract).

    State (per request, keyed by absolute column through `columns.carry`, for the active block's
    columns): the previous step's top-K ids and probabilities and the top-1 run length, far
    smaller than KLASS's full-vocabulary history. Batched; the clean float32 softmax.
    """

    base: Scheduler = field(default_factory=LowConfidenceScheduler)
    confidence: float = 0.9
    persistence: int = bounded(2, most=1024, scales="memory")
    top_k: int = bounded(8, most=1024, scales="memory")
    js_threshold: float = 0.01
    infinite_ok = ("js_threshold",)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0, 1) (a strict bar), got {self.confidence}")
        if self.persistence < 1:
            raise ValueError(f"persistence must be >= 1, got {self.persistence}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if math.isnan(self.js_threshold) or self.js_threshold <= 0.0:
            raise ValueError(f"js_threshold must be in (0, inf], got {self.js_threshold}")

    def own_state(self, batch_size: int, device: torch.device) -> dict[str, Any]:
        return {"start": torch.zeros(batch_size, dtype=torch.long, device=device),
                "ids": torch.zeros(batch_size, 0, self.top_k, dtype=torch.long, device=device),
                "probs": torch.zeros(batch_size, 0, self.top_k, device=device),
                "run": torch.zeros(batch_size, 0, dtype=torch.long, device=device)}

    def select(self, inp: StepInput, state: dict[str, Any]) -> tuple[Decision, dict[str, Any]]:
        batch, width, vocab = inp.probs.shape
        k = min(self.top_k, vocab)
        columns = inp.block[:, :1] + torch.arange(inp.num_steps, device=inp.block.device)    # (B, K)
        index = columns - inp.offset
        inside = (columns < inp.block[:, 1:]) & (index < width)
        index = index.clamp(0, width - 1)
        top = inp.probs.gather(1, index.unsqueeze(-1).expand(-1, -1, vocab)).topk(k, dim=-1)
        probs = torch.nn.functional.pad(top.values, (0, self.top_k - k))
        ids = torch.nn.functional.pad(top.indices, (0, self.top_k - k), value=-1)
        previous_ids = carry(state["ids"], state["start"], columns, -2)
        previous = carry(state["probs"], state["start"], columns, 0.0)
        known = previous_ids[..., 0] >= 0
        run = carry(state["run"], state["start"], columns, 0)
        run = torch.where(known & (previous_ids[..., 0] == ids[..., 0]), run + 1, 1)
        js = topk_js(ids, probs, previous_ids, previous)
        stable = known & (js < self.js_threshold) & (run >= self.persistence)
        confident = inp.confidence.gather(1, index) > self.confidence
        ready_k = (stable & confident & inside).long()
        ready = torch.zeros_like(inp.eligible, dtype=torch.long).scatter_add(1, index, ready_k) > 0

        fallback, state = super().select(inp, state)
        decision = ready_or_fallback(ready, fallback, inp.candidates)
        keep = inside.unsqueeze(-1)
        return decision, {**state, "start": inp.block[:, 0], "ids": torch.where(keep, ids, -2),
                          "probs": torch.where(keep, probs, 0.0), "run": torch.where(inside, run, 0)}
