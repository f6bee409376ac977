"""Learn2PD training rows: one per (decode step, batch row), the block's confidence vector and,
per slot, whether the step's prediction is the reference token (arXiv 2509.25188 §3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_decode.filters.features import block_confidence, block_slots


@dataclass(frozen=True)
class StepData:
    """One row per (decode step, batch row).

    Attributes:
        features: (N, width) float32 block confidences.
        labels: (N, width) bool, the step's prediction equals the reference token.
        valid: (N, width) bool, the slot was masked (the only slots the filter decides).
        prompt: (N,) long index of the prompt the row came from.
    """

    features: Tensor
    labels: Tensor
    valid: Tensor
    prompt: Tensor

    def take(self, keep: Tensor) -> "StepData":
        return StepData(self.features[keep], self.labels[keep], self.valid[keep], self.prompt[keep])

    @staticmethod
    def concat(parts: Sequence["StepData"], width: int) -> "StepData":
        if not parts:
            return StepData(torch.zeros(0, width), torch.zeros(0, width, dtype=torch.bool),
                            torch.zeros(0, width, dtype=torch.bool), torch.zeros(0, dtype=torch.long))
        return StepData(*(torch.cat([getattr(p, name) for p in parts])
                          for name in ("features", "labels", "valid", "prompt")))


def label_slots(confidence: Tensor, predicted: Tensor, reference: Tensor, offset: int, block: Tensor,
                width: int) -> tuple[Tensor, Tensor, Tensor]:
    """Features, labels and valid slots of one step, all (B, width).

    Args:
        confidence: (B, W) the step's confidences (-inf where not eligible).
        predicted: (B, W) the step's candidate tokens (the model's prediction, not what a
            scheduler chose to write).
        reference: (B, W) the reference token per window column (-1 where there is none).
        offset: canvas column of window column 0; block: (B, 2) each row's active block.
        width: the filter's input width.
    """
    features = block_confidence(confidence, offset, block, width)
    column, real = block_slots(offset, block, confidence.shape[1], width)
    labels = predicted.gather(1, column) == reference.gather(1, column)
    valid = real & torch.isfinite(confidence.gather(1, column))
    return features, labels, valid
