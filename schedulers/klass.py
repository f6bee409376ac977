"""KLASS: KL-adaptive stability sampling (Kim et al., 2025, arXiv 2511.05664, §3;
code shkim0116/KLASS@ad87ecb `src/model/llada_klass.py` `stable_confident_decode`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.fields import bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.schedulers.columns import carry
from dllm_decode.schedulers.fixed_steps import LowConfidenceScheduler
from dllm_decode.schedulers.wrapper import Wrapper

_EPS = 1e-12                      # the reference's smoothing inside both logs


@dataclass(frozen=True)
class KLASSScheduler(Wrapper):
    """Commit positions that are both confident and stable; else fall back to `base`.

    Each step, for every position i of the row's active block: KL_i = KL(p_t || p_{t-1}) over
    the full vocabulary, and the last `history` KLs are kept. Ready positions are eligible, have
    c_i > confidence_threshold and all last `history` KLs < kl_threshold (both strict, as the
    code). A row with ready positions commits all of them (`unmask_strategy='all'`); a row with
    none commits what `base` decides (default LLaDA low-confidence, one token per step: the
    reference's top-n_k fallback).

    State: the previous step's probabilities and the KL history for the active block's rows
    only (B, block, V), keyed by absolute column, instead of the reference's whole-canvas
    float64 tensor. Consequences (deviations): a block's positions have no history when it
    starts, so the first ready step is block step `history` (the reference, which keeps
    history for future positions, can fire at step history - 1 after the first block); KL and
    confidence use the clean float32 softmax (the reference takes p from Gumbel-noised logits
    at T > 0). Also fixes the reference's B > 1 bug (the fallback re-created `transfer_index`
    inside the per-row loop, discarding earlier rows).

    Defaults: the code's confidence 0.9, KL 0.01, history 2 (the scripts use 0.6 / 0.015 for
    GSM8K, 0.6 / 0.01 MATH, 0.9 / 0.01 HumanEval, 0.7 / 0.01 MBPP with LLaDA).
    """

    base: Scheduler = field(default_factory=LowConfidenceScheduler)
    confidence_threshold: float = 0.9
    kl_threshold: float = 0.01
    history: int = bounded(2, most=64, scales="memory")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1), got {self.confidence_threshold}")
        if not self.kl_threshold > 0.0:
            raise ValueError(f"kl_threshold must be > 0, got {self.kl_threshold}")
        if self.history < 1:
            raise ValueError(f"history must be >= 1, got {self.history}")

    def own_state(self, batch_size: int, device: torch.device) -> dict[str, Any]:
        return {"start": torch.zeros(batch_size, dtype=torch.long, device=device),
                "probs": None, "kl": torch.zeros(batch_size, 0, self.history, device=device)}

    def select(self, inp: StepInput, state: dict[str, Any]) -> tuple[Decision, dict[str, Any]]:
        batch, width, vocab = inp.probs.shape
        columns = inp.block[:, :1] + torch.arange(inp.num_steps, device=inp.block.device)   # (B, K)
        index = columns - inp.offset
        inside = (columns < inp.block[:, 1:]) & (index < width)
        index = index.clamp(0, width - 1)
        probs = inp.probs.gather(1, index.unsqueeze(-1).expand(-1, -1, vocab))
        if state["probs"] is None:
            kl = torch.full(columns.shape, float("inf"), device=probs.device)
        else:
            previous = carry(state["probs"], state["start"], columns, float("nan"))
            kl = (probs * ((probs + _EPS).log() - (previous + _EPS).log())).sum(-1)
            kl = torch.nan_to_num(kl, nan=float("inf"))             # no previous step: unstable
        history = carry(state["kl"], state["start"], columns, float("inf"))
        history = torch.cat([history[..., 1:], kl.unsqueeze(-1)], -1)
        stable = (history < self.kl_threshold).all(-1)
        confident = inp.confidence.gather(1, index) > self.confidence_threshold   # -inf if not eligible
        ready_k = (stable & confident & inside).long()
        ready = torch.zeros_like(inp.eligible, dtype=torch.long).scatter_add(1, index, ready_k) > 0

        fallback, state = super().select(inp, state)
        decision = ready_or_fallback(ready, fallback, inp.candidates)
        keep = inside.unsqueeze(-1)                  # columns past a row's block are not its rows
        return decision, {**state, "start": inp.block[:, 0], "probs": torch.where(keep, probs, float("nan")),
                          "kl": torch.where(keep, history, float("inf"))}


def ready_or_fallback(ready: Tensor, fallback: Decision, candidates: Tensor) -> Decision:
    """Rows with a ready position commit exactly those (with the candidates); the other rows
    follow the fallback rule's decision."""
    any_ready = ready.any(-1, keepdim=True)
    commit = torch.where(any_ready, ready, fallback.commit)
    tokens = None if fallback.tokens is None else torch.where(any_ready, candidates, fallback.tokens)
    finish = None if fallback.finish is None else fallback.finish & ~any_ready.squeeze(-1)
    return Decision(commit=commit, tokens=tokens, finish=finish, truncate_at=fallback.truncate_at)
