"""PEFT LoRA adapters: read a PEFT adapter folder (`adapter_config.json` + safetensors only,
nothing unpickled), then either merge it into the weights (`merge`) or serve it unmerged next to
other adapters (`attach`), so that requests with different adapters share one batch.

The maths is PEFT's (peft 0.21, `tuners/lora/layer.py`): for a target `nn.Linear` with weight W,
`y = x W^T + s (x A^T) B^T` with A (r, in), B (out, r) and `s = alpha / r` (`alpha / sqrt(r)`
with `use_rslora`), per-module r and alpha from `rank_pattern` / `alpha_pattern` (the first key
`k` with `re.match(rf"(.*\\.)?({k})$", module_name)`, as `peft.utils.get_pattern_key`); merged,
`W' = W + s B A`. Tensor names are `base_model.model.<module path>.lora_{A,B}.weight`; the
families here keep the checkpoint's module names, so a PEFT adapter trained on the HF model (or
on this package's modules) names their modules directly.

Unmerged, the delta runs as a forward hook around each target `nn.Linear` (the module stays in
place with its parameter names; its output gains the delta of each row's adapter): every path that
calls the module runs it. The compact runtime multiplies fused raw weights instead of calling the
modules, so `attach` switches the model to its reference runtime. Which adapter each batch row
uses is set per forward with `rows(model, ids)` (a row id -1: the base model).

Refused (one-line ValueError): any peft type but LORA, DoRA, `fan_in_fan_out`, trained biases,
`modules_to_save`, layer subsets, trainable tokens, parameter targets, and pickled `.bin` weights.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dllm_decode.fields import FLOAT_MOST

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
REFUSED = {"use_dora": False, "fan_in_fan_out": False, "bias": "none", "lora_bias": False,
           "modules_to_save": None, "layers_to_transform": None, "trainable_token_indices": None,
           "target_parameters": None, "alora_invocation_tokens": None, "layer_replication": None,
           "use_qalora": False, "megatron_config": None}
"""adapter_config.json keys this loader refuses unless at their neutral value (None, false,
"none", empty)."""
STATE = "_lora_adapters"
"""The model `__dict__` key of its attached adapters (not a submodule: the model's state_dict
and parameter names stay the checkpoint's)."""


class AdapterError(ValueError):
    """An adapter folder this loader cannot read or that does not fit the model."""


@dataclass(frozen=True)
class LoraDelta:
    """One target module's low-rank update: A (r, in), B (out, r), scale s."""

    a: Tensor
    b: Tensor
    scale: float


@dataclass(frozen=True)
class LoraAdapter:
    """A PEFT LoRA adapter read from a folder: module name -> its delta."""

    name: str
    deltas: Mapping[str, LoraDelta]


def _neutral(value: Any, default: Any) -> bool:
    return value == default or value in (None, False, "none", [], {})


def _pattern(patterns: Mapping[str, Any], name: str, default: Any) -> Any:
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", name):
            return patterns[key]
    return default


def _inside(folder: Path, name: str) -> None:
    """Refuse a file of the folder that links outside it (as a checkpoint's weights may not)."""
    from dllm_decode.models.checkpoint import ModelLoadError, weight_file

    try:
        weight_file(folder, name)
    except ModelLoadError:
        raise AdapterError(f"{folder}: {name} links outside the adapter folder (to "
                           f"{(folder / name).resolve()}); adapter files are read only from inside it") from None


def read_adapter(directory: str | Path, name: str | None = None) -> LoraAdapter:
    """The adapter of a PEFT folder (`adapter_config.json` and `adapter_model.safetensors`).

    Raises:
        AdapterError: a missing file or folder, pickled weights only, a config this loader does
            not support (named), tensors without their pair or of inconsistent ranks.
    """
    from safetensors.torch import load_file

    from dllm_decode.models.hub import first_line

    folder = Path(directory)
    if not (folder / CONFIG).is_file():
        raise AdapterError(f"{folder} is not a PEFT adapter folder: no {CONFIG}")
    _inside(folder, CONFIG)
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise AdapterError(f"{folder / CONFIG} is not valid JSON ({first_line(err)})") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise AdapterError(f"{folder}: only LORA adapters are supported, got peft_type "
                           f"{config.get('peft_type') if isinstance(config, dict) else None!r}")
    for key, default in REFUSED.items():
        if not _neutral(config.get(key, default), default):
            raise AdapterError(f"{folder}: {key}={config[key]!r} is not supported (only {default!r})")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if (isinstance(r, bool) or not isinstance(r, int) or r < 1 or isinstance(alpha, bool)
            or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or abs(alpha) > FLOAT_MOST):
        raise AdapterError(f"{folder}: r must be an integer >= 1 and lora_alpha a finite number within "
                           f"+-{FLOAT_MOST:g}, got {r!r}, {alpha!r}")
    if not (folder / WEIGHTS).is_file():
        also = " (only pickled adapter_model.bin, which is never loaded: convert it to safetensors)" \
            if (folder / "adapter_model.bin").exists() else ""
        raise AdapterError(f"{folder} has no {WEIGHTS}{also}")
    _inside(folder, WEIGHTS)
    try:
        tensors = load_file(str(folder / WEIGHTS))
    except Exception as err:  # noqa: BLE001 - safetensors' own error type: a corrupt or cut file
        raise AdapterError(f"{folder / WEIGHTS} is not a readable safetensors file ({first_line(err)})") from None
    pairs: dict[str, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        match = re.fullmatch(rf"{re.escape(PREFIX)}(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
        if match is None:
            raise AdapterError(f"{folder}: unexpected tensor {key!r} (expected {PREFIX}<module>.lora_A/B.weight)")
        pairs.setdefault(match.group(1), {})[match.group(2)] = value
    deltas = {}
    for module, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"{folder}: {module} has lora_{''.join(pair)} without its pair")
        a, b = pair["A"], pair["B"]
        if not (a.is_floating_point() and b.is_floating_point()) or not bool(a.isfinite().all() and b.isfinite().all()):
            raise AdapterError(f"{folder}: {module} holds non-float or NaN/infinite LoRA weights")
        rank = _pattern(config.get("rank_pattern") or {}, module, r)
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or a.shape[0] != rank:
            raise AdapterError(f"{folder}: {module} has lora_A {tuple(a.shape)} and lora_B "
                               f"{tuple(b.shape)}, not rank {rank}")
        scale_alpha = _pattern(config.get("alpha_pattern") or {}, module, alpha)
        scale = scale_alpha / math.sqrt(rank) if config.get("use_rslora") else scale_alpha / rank
        deltas[module] = LoraDelta(a, b, float(scale))
    if not deltas:
        raise AdapterError(f"{folder}: the adapter has no LoRA tensors")
    return LoraAdapter(name or folder.name, deltas)


def _targets(model: nn.Module, adapter: LoraAdapter) -> dict[str, nn.Linear]:
    """The model's `nn.Linear` for each module the adapter names, shapes checked."""
    modules = dict(model.named_modules())
    out = {}
    for name, delta in adapter.deltas.items():
        module = modules.get(name)
        if not isinstance(module, nn.Linear):
            found = "no such module" if module is None else f"a {type(module).__name__}, not a Linear"
            raise AdapterError(f"adapter {adapter.name!r} targets {name!r}: {found} in this model")
        if delta.a.shape[1] != module.in_features or delta.b.shape[0] != module.out_features:
            raise AdapterError(f"adapter {adapter.name!r}: {name} is {module.in_features} -> "
                               f"{module.out_features}, the adapter's is {delta.a.shape[1]} -> {delta.b.shape[0]}")
        out[name] = module
    return out


def _unsharded(model: nn.Module) -> None:
    if getattr(model, "tensor_parallel", None) is not None:
        raise AdapterError("LoRA adapters are not supported on a tensor-parallel model yet")


@torch.no_grad()
def merge(model: nn.Module, adapter: LoraAdapter) -> nn.Module:
    """`W += s B A` for every target module, in the weight's dtype and device (computed in
    float32). The compact runtime re-fuses its weights on the next forward (version counters)."""
    _unsharded(model)
    for name, module in _targets(model, adapter).items():
        delta = adapter.deltas[name]
        update = delta.scale * (delta.b.float() @ delta.a.float())
        module.weight.add_(update.to(module.weight.device, module.weight.dtype))
    return model


def merge_folders(model: nn.Module, folders: str | Path | Sequence[str | Path]) -> nn.Module:
    """`merge` the adapter of each folder (one folder, or several in order)."""
    for folder in [folders] if isinstance(folders, (str, Path)) else folders:
        merge(model, read_adapter(folder))
    return model


class _Rows(threading.local):
    groups: list[tuple[int, Tensor]] | None = None
    size: int = 0


class Attached:
    """A model's unmerged adapters (ids 0..n-1 in start-up order) and the rows of the forward
    running now."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.current = _Rows()

    def index(self, name: str) -> int:
        return self.names.index(name)


def attach(model: nn.Module, adapters: Sequence[LoraAdapter]) -> Attached:
    """Serve `adapters` unmerged on `model`: a forward hook on every target Linear adds, to the
    output rows of each adapter, that adapter's delta. The model switches to its reference runtime
    (the compact one does not call the modules).

    Raises:
        AdapterError: adapters already attached, two with one name, a target the model lacks.
    """
    _unsharded(model)
    if STATE in model.__dict__:
        raise AdapterError("adapters are already attached to this model")
    names = [a.name for a in adapters]
    if len(set(names)) != len(names):
        raise AdapterError(f"adapter names must be unique, got {names}")
    from dllm_decode.models.compact import set_runtime

    with contextlib.suppress(ValueError, TypeError, AttributeError):   # models without runtimes
        set_runtime(model, "reference")
    state = Attached(names)
    per_module: dict[str, list[tuple[int, LoraDelta]]] = {}
    modules: dict[str, nn.Linear] = {}
    for index, adapter in enumerate(adapters):
        for name, module in _targets(model, adapter).items():
            delta = adapter.deltas[name]
            weight = module.weight
            moved = LoraDelta(delta.a.to(weight.device, weight.dtype), delta.b.to(weight.device, weight.dtype),
                              delta.scale)
            per_module.setdefault(name, []).append((index, moved))
            modules[name] = module
    for name, module in modules.items():
        module.register_forward_hook(_hook(state, dict(per_module[name])))
    model.__dict__[STATE] = state
    return state


def _hook(state: Attached, deltas: dict[int, LoraDelta]) -> Any:
    def add_delta(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        groups = state.current.groups
        if not groups:
            return output
        x = args[0]
        if x.shape[0] != state.current.size:
            raise RuntimeError(f"a LoRA forward over {x.shape[0]} rows, but adapters were set for "
                               f"{state.current.size}")
        out = output
        for index, rows in groups:
            delta = deltas.get(index)
            if delta is None:
                continue
            part = (x.index_select(0, rows) @ delta.a.t()) @ delta.b.t()
            out = out.index_add(0, rows, part, alpha=delta.scale)
        return out
    return add_delta


def attached(model: nn.Module) -> Attached | None:
    """The model's unmerged adapters, or None."""
    return model.__dict__.get(STATE)


@contextlib.contextmanager
def rows(model: nn.Module, ids: Sequence[int]) -> Iterator[None]:
    """Within the block, the model's forwards give batch row i adapter `ids[i]` (-1: none).
    Groups are formed once here (host side), not per layer."""
    state = attached(model)
    if state is None or all(i < 0 for i in ids):
        yield
        return
    device = next(model.parameters()).device
    groups = [(index, torch.tensor([r for r, i in enumerate(ids) if i == index], device=device))
              for index in sorted(set(ids)) if index >= 0]
    previous = (state.current.groups, state.current.size)
    state.current.groups, state.current.size = groups, len(ids)
    try:
        yield
    finally:
        state.current.groups, state.current.size = previous


def adapter_index(model: nn.Module, name: str | None) -> int:
    """The id of an attached adapter by name (-1 for None: the model's own weights).

    Raises:
        ValueError: a name not attached to this model (the message lists those that are).
    """
    if name is None:
        return -1
    state = attached(model)
    names = [] if state is None else state.names
    if name not in names:
        raise ValueError(f"unknown adapter {name!r}; adapters loaded: {', '.join(names) or 'none'}")
    return names.index(name)


def adapter_rows(model: nn.Module, batch: Any) -> Any:
    """`rows` for a running batch (`running.Batch`): each row takes its request's adapter
    (`Member.adapter`); a no-op context when no request in it has one."""
    if all(member.adapter < 0 for member in batch.members):
        return contextlib.nullcontext()
    ids = [-1] * len(batch)
    for g, members_rows in batch.groups.items():
        for row in members_rows:
            ids[row] = batch.members[g].adapter
    return rows(model, ids)
