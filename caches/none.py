"""No cache: a full forward over the whole canvas every step (the exact reference)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from dllm_decode.interfaces import Cache, DiffusionLM


@dataclass(frozen=True)
class NoCache(Cache):
    """Recompute every position each step; logits from the block start to the canvas end."""

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any) -> tuple[Tensor, int, Any]:
        return model(canvas, attention_mask, rows=(block[0], canvas.shape[1])), block[0], state
