"""LocalLeap: local determinism propagation (Kong et al., 2025, arXiv 2510.07081, §3-§4.1;
code friedrichor/LocalLeap `llada/generate.py`, via a public mirror)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput


@dataclass(frozen=True)
class LocalLeapScheduler(Scheduler):
    """Confident anchors relax the threshold of their masked neighbours.

    anchors A = {i eligible : c_i >= kappa}; N = union over a in A of [a - radius, a + radius];
    commit {i eligible : c_i >= (tau if i in N else kappa)}, plus the loop's forced argmax when
    nothing passes. With no anchor this is the threshold rule at kappa. Propagation is one hop
    per step (a neighbour promoted now does not extend N now). Ties pass (`>=`) for both bars;
    the radius edge is inclusive (distance exactly `radius` is a neighbour).

    Vectorised and batch-safe: N is a 1-D max-pool dilation of the anchor mask over 2*radius + 1
    columns, instead of the reference's Python sets and per-position loops (batch 1 only).
    Neighbourhoods may cross the block edge; those columns are not eligible, so it is harmless.
    Defaults kappa = 0.9, tau = 0.75, radius = 4 (paper §4.1, scripts/llada/run.sh). The
    reference falls back to LLaDA's fixed schedule when `threshold=None`; not provided here.
    """

    canvas_kinds: ClassVar[tuple[str, ...]] = ("mask", "noise")   # its rule reads only the step's view

    kappa: float = 0.9
    tau: float = 0.75
    radius: int = bounded(4, most=MAX_CANVAS, scales="memory")

    def __post_init__(self) -> None:
        if not 0.0 < self.kappa <= 1.0:
            raise ValueError(f"kappa must be in (0, 1], got {self.kappa}")
        if not 0.0 < self.tau <= self.kappa:
            raise ValueError(f"tau must be in (0, kappa={self.kappa}], got {self.tau}")
        if self.radius < 0:
            raise ValueError(f"radius must be >= 0, got {self.radius}")

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        anchors = (inp.confidence >= self.kappa).float().unsqueeze(1)        # (B, 1, W)
        near = torch.nn.functional.max_pool1d(anchors, kernel_size=2 * self.radius + 1, stride=1,
                                              padding=self.radius).squeeze(1).bool()
        bar = torch.where(near, self.tau, self.kappa)
        return Decision(commit=inp.confidence >= bar), state
