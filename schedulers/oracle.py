"""The reference-guided "extremely greedy parallel" oracle (Learn2PD, Bao et al., 2025, arXiv
2509.25188, §3; simulation in ims-kdks/Learning-to-Parallel-Decoding@342293c
`llada/generate_training_data.py`). An analysis tool: its NFE is the lower bound other
schedulers are judged against."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import Decision, DiffusionLM, Scheduler, StepInput
from dllm_decode.ops import argmax_mask, topk_mask
from dllm_decode.sampler import generate
from dllm_decode.schedulers.fixed_steps import LowConfidenceScheduler

STALL_RULES = ("confident", "leftmost")


@dataclass(frozen=True)
class OracleScheduler(Scheduler):
    """Commit exactly the eligible positions whose candidate equals the reference token.

    Correct tokens are never re-masked, so with the model's own output as reference the final
    text equals that output by construction, and the NFE counts how many steps the baseline
    wasted. When no eligible candidate matches (a stall), commit one reference token, at the
    most confident eligible position (`on_stall="confident"`) or the leftmost one
    (`"leftmost"`), and count the step. Learn2PD instead copies the reference into the whole
    block without counting a step when the block's argmax stops changing, undercounting NFE.

    `reference` holds the generated-region token ids per row (one row is broadcast over the
    batch); build it with `oracle_reference` and `OracleScheduler.from_reference`. Positions
    past the reference's length, or every position when `reference` is empty, have no
    reference: there every step stalls, and the stall rule commits the candidate, which with
    `"confident"` is LLaDA's low-confidence decoding at one token per step (the default
    reference itself). The oracle is greedy, not a proven minimum: a scheduler reaching a
    different correct answer may use fewer steps.
    """

    reference: tuple[tuple[int, ...], ...] = ()
    on_stall: str = "confident"

    def __post_init__(self) -> None:
        if self.on_stall not in STALL_RULES:
            raise ValueError(f"on_stall must be one of {STALL_RULES}, got {self.on_stall!r}")
        if not isinstance(self.reference, tuple) or not all(
                isinstance(row, tuple) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                               for t in row) for row in self.reference):
            raise TypeError(f"OracleScheduler.reference must be a tuple of rows of token ids >= 0 "
                            f"(build it with from_reference), got {self.reference!r:.80}")
        if len({len(row) for row in self.reference}) > 1:
            raise ValueError(f"reference rows must all have the same length, got "
                             f"{sorted({len(row) for row in self.reference})}")

    @classmethod
    def from_reference(cls, tokens: Tensor | Sequence[Sequence[int]], **fields: Any) -> "OracleScheduler":
        """An oracle for (B, G) reference token ids (e.g. `oracle_reference(...)`)."""
        rows = tokens.tolist() if isinstance(tokens, Tensor) else tokens
        return cls(reference=tuple(tuple(int(t) for t in row) for row in rows), **fields)

    def check_fits(self, vocab_size: int, gen_length: int) -> None:
        if not self.reference:
            return
        if len(self.reference[0]) != gen_length:
            raise ValueError(f"oracle: the reference has {len(self.reference[0])} tokens per row; "
                             f"the canvas has gen_length {gen_length}")
        if (top := max(max(row) for row in self.reference)) >= vocab_size:
            raise ValueError(f"oracle: the reference holds token id {top}, outside the model's "
                             f"vocabulary [0, {vocab_size})")

    def init_state(self, batch_size: int, device: torch.device) -> Tensor:
        """(B, G) reference ids for this request's rows."""
        if not self.reference:
            return torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        reference = torch.tensor(self.reference, dtype=torch.long, device=device)
        if reference.shape[0] == 1:
            return reference.expand(batch_size, -1)
        if reference.shape[0] != batch_size:
            raise ValueError(f"reference has {reference.shape[0]} rows; the batch has {batch_size}")
        return reference

    def select(self, inp: StepInput, state: Tensor) -> tuple[Decision, Tensor]:
        target = self.window_reference(inp, state)
        match = inp.eligible & (inp.candidates == target)
        stalled = inp.live & ~match.any(-1)
        if self.on_stall == "confident":
            pick = argmax_mask(inp.confidence)
        else:
            leftmost = torch.where(inp.eligible, -inp.columns.float(), float("-inf"))
            pick = topk_mask(leftmost, torch.ones_like(stalled, dtype=torch.long))
        pick = pick & stalled.unsqueeze(-1)
        tokens = torch.where(target >= 0, target, inp.candidates)
        return Decision(commit=match | pick, tokens=tokens), state

    @staticmethod
    def window_reference(inp: StepInput, reference: Tensor) -> Tensor:
        """(B, W) reference id per window column, -1 where there is none."""
        index = inp.columns - inp.gen_span[:, :1]
        known = (index >= 0) & (index < reference.shape[1])
        if reference.shape[1] == 0:
            return torch.full_like(index, -1)
        target = reference.gather(1, index.clamp(0, reference.shape[1] - 1))
        return torch.where(known, target, -1)


def oracle_reference(model: DiffusionLM, prompts: Sequence[str] | Sequence[Sequence[int]],
                     config: DecodeConfig, **generate_kwargs: Any) -> Tensor:
    """The model's own one-token-per-step output (LLaDA low-confidence), the oracle's default
    reference: (B, G) token ids. Extra keyword arguments go to `generate` (cache, tokenizer)."""
    baseline = dataclasses.replace(config, scheduler=LowConfidenceScheduler())
    return generate(model, prompts, baseline, **generate_kwargs).tokens
