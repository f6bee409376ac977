"""compressed-tensors (LLM Compressor) FP8 checkpoints: `format: float-quantized`.

Tensors per quantized linear `<m>` (compressed-tensors 0.20): `<m>.weight` F8_E4M3 (N, K) and
`<m>.weight_scale` in the model dtype, (N, 1) for strategy `channel` or (1,) for `tensor`;
`W = weight.float() * weight_scale`. A static scheme's `<m>.input_scale` (activation
quantization) is dropped: the layers here are weight-only. Block scales, int formats (pack-
quantized), sparsity, transforms (rotations) and a KV-cache scheme are refused.
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_decode.quant.codes import FP8, SCALE_DTYPE
from dllm_decode.quant.spec import CheckpointQuantization, QuantError, QuantSpec

STRATEGIES = ("channel", "tensor")


def compressed_tensors_reader(raw: dict[str, Any], where: str) -> CheckpointQuantization:
    def refuse(what: str) -> QuantError:
        return QuantError(f"{where}: compressed-tensors {what}; accepted: float-quantized FP8 "
                          f"weights with {'/'.join(STRATEGIES)} scales")

    for key in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if raw.get(key):
            raise refuse(f"{key} is not supported")
    groups = raw.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise refuse("config has no config_groups")
    for name, group in groups.items():
        fmt = group.get("format") or raw.get("format")
        weights = group.get("weights") or {}
        if fmt != "float-quantized":
            raise refuse(f"format {fmt!r} (group {name}) is not supported")
        if weights.get("num_bits") != 8 or weights.get("type") != "float":
            raise refuse(f"weights {weights.get('num_bits')}-bit {weights.get('type')!r} "
                         f"(group {name}) are not supported")
        if weights.get("strategy") not in STRATEGIES:
            raise refuse(f"weight strategy {weights.get('strategy')!r} (group {name}) is not "
                         f"supported")
    return CheckpointQuantization(QuantSpec("fp8"), convert)


def convert(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], set[str]]:
    """compressed-tensors names -> the own layout (`<m>.weight_q`, `<m>.weight_scale`)."""
    out: dict[str, torch.Tensor] = {}
    layers: set[str] = set()
    for name, tensor in state.items():
        if name.endswith(".input_scale"):
            continue
        module = name.rpartition(".")[0]
        if name.endswith(".weight") and tensor.dtype == FP8:
            scale = state.get(f"{module}.weight_scale")
            if scale is None:
                raise QuantError(f"compressed-tensors checkpoint: {name} has no weight_scale")
            rows = tensor.shape[0]
            out[f"{module}.weight_q"] = tensor
            out[f"{module}.weight_scale"] = scale.float().reshape(-1, 1).expand(rows, 1) \
                .to(SCALE_DTYPE).contiguous()
            layers.add(module)
        elif not name.endswith(".weight_scale"):
            out[name] = tensor
    return out, layers
