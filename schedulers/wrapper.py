"""`Wrapper`: a policy that adds one rule around any `base` scheduler (composition, not special cases).

CreditDecoding fuses logits before the base selects, AdaBlock chooses block ends and lets the
base select, Prophet may finish a row before the base's commit, KLASS falls back to the base when
no position is ready. Each is a `Wrapper` subclass; the base is any registered scheduler (itself
possibly a wrapper), configured from the CLI with `-o base=NAME -o base.FIELD=VALUE`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.schedulers.threshold import ThresholdScheduler


@dataclass(frozen=True)
class Wrapper(Scheduler):
    """Delegates every hook to `base`; the state is a dict whose "base" entry is the base's state.

    `view`, `chooses_block_bounds`, `revises`, `post_steps`, `caches`, `lookahead_candidates`,
    `guide`, `needs_noise` and `step_budget` follow the base unless a subclass fixes them, so a wrapper around AdaBlock still gets the wide view and uneven blocks it needs,
    and one around a revising rule keeps its scope.
    """

    base: Scheduler = field(default_factory=ThresholdScheduler)

    def __post_init__(self) -> None:
        if not isinstance(self.base, Scheduler):
            raise ValueError(f"base must be a Scheduler, got {type(self.base).__name__}")

    @property
    def view(self) -> str:                                   # type: ignore[override]
        return self.base.view

    @property
    def chooses_block_bounds(self) -> bool:                  # type: ignore[override]
        return self.base.chooses_block_bounds

    @property
    def revises(self) -> str:                                # type: ignore[override]
        return self.base.revises

    @property
    def post_steps(self) -> int:                             # type: ignore[override]
        return self.base.post_steps

    @property
    def caches(self) -> tuple[str, ...] | None:             # type: ignore[override]
        return self.base.caches

    @property
    def lookahead_candidates(self) -> int:                   # type: ignore[override]
        return self.base.lookahead_candidates

    @property
    def guide(self) -> str | None:                           # type: ignore[override]
        return self.base.guide

    @property
    def needs_noise(self) -> bool:                           # type: ignore[override]
        return self.base.needs_noise

    def step_budget(self, block_length: int) -> int | None:
        return self.base.step_budget(block_length)

    def lookahead(self, inp: StepInput, state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        actions, tokens, base = self.base.lookahead(inp, state["base"])
        return actions, tokens, {**state, "base": base}

    def check_fits(self, vocab_size: int, gen_length: int) -> None:
        self.base.check_fits(vocab_size, gen_length)

    def check_config(self, config: Any) -> None:
        self.base.check_config(config)

    def own_state(self, batch_size: int, device: torch.device) -> dict[str, Any]:
        """The wrapper's own per-request state entries (none by default)."""
        return {}

    def init_state(self, batch_size: int, device: torch.device) -> dict[str, Any]:
        return {**self.own_state(batch_size, device), "base": self.base.init_state(batch_size, device)}

    def block_end(self, inp: StepInput, state: dict[str, Any]) -> tuple[torch.Tensor | None, dict[str, Any]]:
        ends, base = self.base.block_end(inp, state["base"])
        return ends, {**state, "base": base}

    def process_logits(self, inp: StepInput, state: dict[str, Any]) -> tuple[torch.Tensor | None, dict[str, Any]]:
        logits, base = self.base.process_logits(inp, state["base"])
        return logits, {**state, "base": base}

    def select(self, inp: StepInput, state: dict[str, Any]) -> tuple[Decision, dict[str, Any]]:
        decision, base = self.base.select(inp, state["base"])
        return decision, {**state, "base": base}

    def select_rows(self, state: dict[str, Any], rows: torch.Tensor) -> dict[str, Any]:
        own = {key: value for key, value in state.items() if key != "base"}
        return {**super().select_rows(own, rows), "base": self.base.select_rows(state["base"], rows)}
