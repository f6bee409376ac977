"""Quantize a model: one function that swaps its linear layers for `QuantLinear`s.

Which layers: every `nn.Linear` (attention and MLP projections, each MoE expert's and shared
expert's projections, row-parallel shards) except a head that projects to the vocabulary.
Embeddings, norms and MoE routers are not `nn.Linear` and stay in float, as in the field's
checkpoints (compressed-tensors' `ignore: [lm_head]`, GPTQModel's `lm_head: false`).

Under tensor parallelism call it after sharding: each rank then quantizes its own shard (a
row-parallel shard's groups lie inside the rank's input columns), and the `QuantLinear` keeps the
shard's all_reduce.
"""

from __future__ import annotations

from typing import Callable, Iterator, NamedTuple

import torch
from torch import nn

from dllm_decode.quant.codes import Codes
from dllm_decode.quant.linear import QuantLinear
from dllm_decode.quant.spec import QuantError, QuantSpec


def quantizable(model: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    """(path, layer) of every linear layer `quantize_model` swaps, in module order."""
    vocab = getattr(model, "vocab_size", None)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.out_features != vocab:
            yield name, module


def check_group_size(model: nn.Module, spec: QuantSpec) -> None:
    """Raise `QuantError` unless int4's group divides every quantized layer's input width (under
    tensor parallelism: each rank's shard of it). Cheap: reads shapes only (works on the meta
    device, before any weight is read)."""
    if spec.format != "int4":
        return
    for name, layer in quantizable(model):
        if layer.in_features % spec.group_size:
            raise QuantError(f"int4 group_size {spec.group_size} does not divide the input width "
                             f"{layer.in_features} of {name}; choose a group size that divides "
                             f"every layer's input width")


class Swapped(NamedTuple):
    layers: int
    parameters: int


def quantize_model(model: nn.Module, spec: QuantSpec | str, group_size: int | None = None,
                   codes: Callable[[str, nn.Linear], Codes | None] | None = None,
                   kernel: str = "torchao") -> nn.Module:
    """Replace `model`'s linear layers (`quantizable`) with `QuantLinear`s in place; returns it.

    Args:
        spec: a `QuantSpec` or a format name (`int8`, `int4`, `fp8`), with `group_size` for int4.
        codes: optional (path, layer) -> the layer's codes (a calibrated method such as GPTQ);
            None for a layer means round to nearest.
        kernel: `QuantLinear`'s kernel (`torchao`, or `dequant`).
    Raises:
        QuantError: an unknown format or a group size that does not divide a layer.
    """
    spec = QuantSpec.of(spec, group_size)
    check_group_size(model, spec)
    runtime = _before_swap(model)
    parents = {id(child): (parent, attr) for parent in model.modules()
               for attr, child in parent.named_children()}
    for name, layer in list(quantizable(model)):
        given = codes(name, layer) if codes is not None else None
        new = QuantLinear.from_linear(layer, spec.format, spec.group_size, given, kernel)
        parent, attr = parents[id(layer)]
        setattr(parent, attr, new)
        layer._parameters.clear()      # a kept `reduce` binds the old module: let its weight go
    model.quantization = spec
    if runtime == "compact":           # it fuses the quantized q|k|v and gate|up (`fuse_rows`)
        from dllm_decode.models.compact import default_runtime, set_runtime

        set_runtime(model, default_runtime(model))
    return model


def prepare_quantized(model: nn.Module, spec: QuantSpec, only: set[str] | None = None) -> nn.Module:
    """Swap `model`'s linear layers (those at the paths `only`, default all `quantizable`) for
    empty `QuantLinear` shells on the meta device, ready to take a quantized checkpoint's tensors
    (`load_state_dict(assign=True)`)."""
    check_group_size(model, spec)
    _before_swap(model)
    parents = {id(child): (parent, attr) for parent in model.modules()
               for attr, child in parent.named_children()}
    for name, layer in list(quantizable(model)):
        if only is not None and name not in only:
            continue
        new = QuantLinear(layer.in_features, layer.out_features, spec.format, spec.group_size,
                          layer.bias is not None, device="meta", dtype=layer.weight.dtype,
                          reduce=getattr(layer, "reduce", None))
        parent, attr = parents[id(layer)]
        setattr(parent, attr, new)
    model.quantization = spec
    return model


def _before_swap(model: nn.Module) -> str | None:
    """Leave what is built from float weights: the compact runtime's fused matrices (rebuilt
    from the quantized layers when the model runs compact again) and stacked MoE experts (the
    expert loop calls the quantized modules). Returns the runtime the model had."""
    from dllm_decode.models.compact import set_runtime

    runtime = getattr(model, "runtime", None)
    if runtime == "compact":
        set_runtime(model, "reference")
    for module in model.modules():
        if getattr(module, "moe_impl", None) == "static":
            module.moe_impl = "loop"
        if hasattr(module, "_stacked"):
            module._stacked = None
    return runtime



def weight_bytes(model: nn.Module) -> int:
    """Bytes of the storages behind `model`'s parameters and buffers, each counted once (the
    compact runtime's weights are views of shared fused matrices): codes, scales, zeros, and the
    float tensors left unquantized."""
    storages = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def quantized_layers(model: nn.Module) -> list[tuple[str, QuantLinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QuantLinear)]


def float_dtype(model: nn.Module) -> torch.dtype:
    """The model's float dtype (its first floating parameter's)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
