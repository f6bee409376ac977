"""LLaDA2.1's joint threshold decoding: mask-to-token commits plus token-to-token edits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_decode.fields import bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput


@dataclass(frozen=True)
class EditScheduler(Scheduler):
    """Commit confident masks and overwrite committed block tokens the model now disagrees with.

    LLaDA2.1 (Bie et al., 2026, arXiv 2602.08676; HF `generate` in `modeling_llada21_moe.py` and
    SGLang's `JointThreshold`), on the active block only:

    * M2T: every masked position with p(x̂) > `threshold` (the loop adds the most confident one
      when none clears it: HF's `num_to_transfer = 1`);
    * T2T: every committed, non-prompt position of the block whose argmax x̂ differs from its
      current token with p(x̂) > `edit_threshold` is overwritten with x̂;
    * once the block holds no mask, up to `post_steps` further passes that edit only; a pass
      that edits nothing ends the block.

    Defaults are HF `generate`'s (0.95 / 0.9 / 16; SGLang's "full editing" is 0.5 / 0.0 / 16);
    both thresholds are strict (`>`), as in both references. Usable on any model, but it only helps
    models trained to predict at unmasked positions (LLaDA2.1): a LLaDA-style masked-diffusion
    model is trained on masked positions only, so its predictions at committed ones are untrained
    and its edits are noise (on the embedded model it is far less accurate than `threshold`).
    Deviations: the loop caps revisions at `MAX_REVISIONS` per column (the references rely on
    the pass budget alone, so two tokens may alternate until it runs out), and the prompt is
    protected by the loop's scope (only generated columns are ever `revisable`).
    """

    revises: ClassVar[str] = "block"

    threshold: float = 0.95
    edit_threshold: float = 0.9
    post_steps: int = bounded(16, most=4096, scales="steps")

    def __post_init__(self) -> None:
        for name in ("threshold", "edit_threshold"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1) (a strict `>` bar), got {value}")
        if self.post_steps < 0:
            raise ValueError(f"post_steps must be >= 0, got {self.post_steps}")

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        commit = inp.confidence > self.threshold
        revisable = inp.revisable if inp.revisable is not None else torch.zeros_like(inp.eligible)
        sure = inp.probs.gather(-1, inp.candidates.unsqueeze(-1)).squeeze(-1) > self.edit_threshold
        edit = revisable & sure & (inp.candidates != inp.current)
        return Decision(commit=commit, edit=edit), state
