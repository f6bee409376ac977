"""Calibration statistics: the input Hessian (sum of x x^T over rows) of every linear layer,
gathered by forward hooks while the float model runs whatever the caller runs under the
recorder: real decodes (each forward is a canvas at the mask ratio and step the decoder visits)
or plain forwards over clean text."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dllm_decode.quant.apply import quantizable

MAX_CALIBRATION = 512
"""The most calibration prompts a run takes (`--calibration`): the Hessians are exact sums, and
hundreds of decodes already cover every mask ratio the decoder visits."""


class HessianRecorder:
    """`with HessianRecorder(model) as rec:` run the model; then `rec.hessians[path]` is the
    float64 (K, K) sum of x x^T over every row fed to the layer at `path`, `rec.rows[path]` the
    row count. Layers sharing an input (q, k, v) each keep their own sum (simple; K^2 floats
    per layer)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.hessians: dict[str, Tensor] = {}
        self.rows: dict[str, int] = {}
        self._handles: list[Any] = []
        self._runtime: str | None = None

    def __enter__(self) -> "HessianRecorder":
        from dllm_decode.models.compact import set_runtime

        # the compact runtime multiplies fused matrices, not the modules: hooks need reference
        self._runtime = getattr(self.model, "runtime", None)
        if self._runtime == "compact":
            set_runtime(self.model, "reference")
        for path, layer in quantizable(self.model):
            self._handles.append(layer.register_forward_pre_hook(self._hook(path)))
        return self

    def __exit__(self, *exc: Any) -> None:
        from dllm_decode.models.compact import set_runtime

        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._runtime == "compact":
            set_runtime(self.model, "compact")

    def _hook(self, path: str) -> Any:
        def record(module: nn.Module, args: tuple[Tensor, ...]) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()
            total = self.hessians.get(path)
            update = x.t() @ x
            self.hessians[path] = update if total is None else total + update
            self.rows[path] = self.rows.get(path, 0) + x.shape[0]
        return record
