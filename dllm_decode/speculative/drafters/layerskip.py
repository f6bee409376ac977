"""Self-speculation by layer skipping: the target with a subset of its layers is its own draft.

Draft & Verify (Zhang et al., ACL 2024, arXiv 2309.08168) skips intermediate layers chosen
offline; LayerSkip / HF `assistant_early_exit` keeps the first N layers. Both are a subset of
decoder layers followed by the target's final norm and LM head; verification by the full model
keeps the output identical to the target's.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from dllm_decode.speculative.compact import CompactCausalLM, resolve_runtime
from dllm_decode.speculative.drafters.model import ModelDrafter
from dllm_decode.speculative.drafters.spec import Built, DraftContext, DraftSpec
from dllm_decode.speculative.tree import TreeShape


def parse_layers(spec: str, num_layers: int) -> tuple[int, ...]:
    """`"N"` -> the first N layers (early exit); `"0,2,3"` -> those layers (Draft & Verify).

    Raises:
        ValueError: malformed text, an index outside [0, num_layers), no layer, all layers, or a
            subset without layer 0 (the cache reads the sequence length from layer 0).
    """
    layers = _layer_list(spec)
    if not layers or layers[0] != 0 or layers[-1] >= num_layers:
        raise ValueError(f"layerskip layers must include layer 0 and lie in [0, {num_layers}), "
                         f"got {spec!r}")
    if len(layers) == num_layers:
        raise ValueError(f"layerskip {spec!r} keeps all {num_layers} layers: nothing is skipped")
    return layers


def _layer_list(spec: str) -> tuple[int, ...]:
    """The layers `spec` names, before they are checked against a model."""
    text = spec.strip()
    try:
        if "," in text:
            return tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
        return tuple(range(int(text)))
    except ValueError:
        raise ValueError(f"layerskip expects N (first N layers) or a comma list of layer indices, "
                         f"got {spec!r}") from None


def layer_subset(model: nn.Module, layers: Sequence[int]) -> nn.Module:
    """A shallow copy of a transformers decoder LM that runs only `layers` (weights shared).

    The kept attention modules keep their original `layer_idx`, so a dynamic cache stores their
    keys/values under the original indices (skipped ones stay empty). Needs `model.model.layers`
    (Llama, Mistral, Qwen2, SmolLM2, ... layouts).

    Raises:
        ValueError: the model has no `model.layers` list.
    """
    inner = getattr(model, "model", None)
    if not isinstance(getattr(inner, "layers", None), nn.ModuleList):
        raise ValueError(f"layer skipping needs a decoder with `model.layers`; "
                         f"{type(model).__name__} has none")
    count = len(inner.layers)
    layers = list(layers)
    if not layers:
        raise ValueError("layer skipping needs at least one layer to keep")
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not -count <= i < count:
            raise ValueError(f"layer {i!r} does not exist; {type(model).__name__} has layers 0..{count - 1}")
    shallow_inner = copy.copy(inner)
    shallow_inner._modules = dict(inner._modules)
    shallow_inner._modules["layers"] = nn.ModuleList(inner.layers[i] for i in layers)
    shallow = copy.copy(model)
    shallow._modules = dict(model._modules)
    shallow._modules["model"] = shallow_inner
    return shallow


def layerskip_drafter(model: nn.Module, spec: str, runtime: str = "hf",
                      tree: TreeShape | None = None) -> ModelDrafter:
    """`layerskip:SPEC` of the CLI: a `ModelDrafter` over the layers `parse_layers(SPEC)` picks,
    run by transformers (`hf`: `layer_subset`) or by `CompactCausalLM` (`compact`; `auto` picks
    it when the model supports it), drafting chains or `tree`s.

    Raises:
        ValueError: a bad SPEC, or `compact` for a model it does not support."""
    num_layers = len(getattr(getattr(model, "model", None), "layers", ()))
    layers = parse_layers(spec, num_layers)
    if resolve_runtime(model, runtime) == "compact":
        return ModelDrafter(CompactCausalLM(model, layers), tree)
    return ModelDrafter(layer_subset(model, layers), tree)


@dataclass(frozen=True)
class LayerSkipDraft(DraftSpec):
    """The target with some of its layers skipped drafts for itself (early exit, Draft & Verify).

    Attributes:
        layers: `N` keeps the first N layers (early exit), `0,2,3` keeps those layers (Draft &
            Verify); layer 0 always stays, and at least one layer must be skipped.
    """

    drafts_trees: ClassVar[bool] = True

    layers: str = ""

    def __post_init__(self) -> None:
        _layer_list(self.layers)

    def build(self, context: DraftContext) -> Built:
        target = context.target
        drafter = layerskip_drafter(target, self.layers, context.runtime, context.tree)
        source = layer_subset(target, parse_layers(self.layers, len(target.model.layers)))
        return Built(drafter, source)
