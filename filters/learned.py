"""Learn2PD: a learned filter that commits masked positions whose prediction is already final."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dllm_decode.fields import bounded, file_option
from dllm_decode.interfaces import Decision, Filter, StepInput
from dllm_decode.filters.features import block_confidence, slots_to_window
from dllm_decode.filters.mlp import SHIPPED, load_mlp

MODES = ("union", "only")


@dataclass(frozen=True)
class LearnedFilter(Filter):
    """Commit every masked block position a small MLP over the block's confidences accepts.

    Learn2PD (Bao et al., arXiv 2509.25188; `ims-kdks/Learning-to-Parallel-Decoding@342293c:
    llada/generate.py`, `generate_learn2parallel`): the active block's top-1 confidences, one per
    block slot, go through `ConfidenceMLP`; a masked slot whose accept probability exceeds
    `threshold` is committed with its candidate token. The network was trained to predict "this
    prediction equals the final output" (`eval/training/filter.py`).

    Deviations: committed and padding slots feed the constant `dllm_decode.filters.features.SETTLED` instead
    of the model's top-1 probability there (see that constant); a block narrower than `width` is
    padded with it, a wider one is cropped (slots past `width` get only the base schedule).

    Attributes:
        weights: local safetensors file of a trained `ConfidenceMLP`, or `embedded` for the filter
            shipped with the embedded model.
        width: the network's input width (the block length it was trained on); must match the file.
        threshold: accept when sigmoid(logit) > threshold, in [0, 1] (paper: 0.96).
        mode: `union` keeps the scheduler's commits and adds the accepted ones (the paper runs the
            LLaDA one-token-per-step schedule underneath); `only` replaces them, and the loop's
            forced progress commits the most confident position when nothing is accepted.
    Raises:
        ValueError: bad mode/threshold/width, or weights missing or of another width.
    """

    weights: str = file_option(SHIPPED)                        # start-up only
    width: int = bounded(32, most=4096, scales="memory")
    threshold: float = 0.96
    mode: str = "union"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        if self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")
        trained = load_mlp(self.weights).width
        if trained != self.width:
            raise ValueError(f"learned filter weights {self.weights!r} have width {trained}, "
                             f"but width={self.width} was asked for")

    def accept(self, inp: StepInput) -> torch.Tensor:
        """(B, W) bool: eligible window columns the network accepts."""
        features = block_confidence(inp.confidence, inp.offset, inp.block, self.width)
        mlp = load_mlp(self.weights).to(features.device)
        accepted = torch.sigmoid(mlp(features)) > self.threshold
        return slots_to_window(accepted, inp.offset, inp.block, inp.eligible.shape[1]) & inp.eligible

    def __call__(self, inp: StepInput, decision: Decision) -> Decision:
        accepted = self.accept(inp)
        commit = decision.commit | accepted if self.mode == "union" else accepted
        tokens = decision.tokens
        if tokens is not None:                  # accepted columns carry the step's candidates
            tokens = torch.where(accepted & ~decision.commit, inp.candidates, tokens)
        return dataclasses.replace(decision, commit=commit, tokens=tokens)
