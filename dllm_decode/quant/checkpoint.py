"""Quantized checkpoints: write this package's own layout, and read it and the layouts the field
ships (compressed-tensors FP8, GPTQ int4) from `config.json`'s `quantization_config`.

Own layout (`quant_method: "dllm-decode"`): one `model.safetensors` whose quantized layers hold
`<m>.weight_q`, `<m>.weight_scale` (and int4's `<m>.weight_zero`) as `codes.py` describes, every
other tensor as in the float checkpoint; `quantization_config = {"quant_method": "dllm-decode",
"format": ..., "group_size": ..., "calibration": ...}`. Plain tensors only: nothing is unpickled.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dllm_decode.quant.spec import CheckpointQuantization, QuantError, QuantSpec

OWN_METHOD = "dllm-decode"
ACCEPTED = (f"{OWN_METHOD!r}, 'compressed-tensors' (float-quantized FP8, channel or tensor "
            f"weight scales) and 'gptq' (4-bit, GPTQModel's gptq / gptq_v2 packing)")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def checkpoint_quantization(config: dict[str, Any], where: str) -> CheckpointQuantization | None:
    """The reader of a checkpoint's `quantization_config`, or None for a float checkpoint.

    Raises:
        QuantError: a quantization config this package does not read (one line, naming what it
            accepts).
    """
    raw = config.get("quantization_config")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise QuantError(f"{where}: quantization_config must be an object; accepted methods: "
                         f"{ACCEPTED}")
    method = raw.get("quant_method")
    if method == OWN_METHOD:
        try:
            spec = QuantSpec(raw.get("format"), raw.get("group_size"))
        except QuantError as err:
            raise QuantError(f"{where}: quantization_config: {err}") from None
        return CheckpointQuantization(spec, _own_layers)
    if method == "compressed-tensors":
        from dllm_decode.quant.compressed import compressed_tensors_reader

        return compressed_tensors_reader(raw, where)
    if method == "gptq":
        from dllm_decode.quant.gptq_format import gptq_reader

        return gptq_reader(raw, where)
    raise QuantError(f"{where}: quantization_config quant_method {method!r} is not one this "
                     f"toolkit loads; accepted: {ACCEPTED}")


def _own_layers(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], set[str]]:
    stale = next((name for name, t in state.items() if name.endswith(".weight_zero")
                  and t.is_floating_point()), None)
    if stale is not None:
        raise QuantError(f"{stale} holds float int4 zeros, the layout before integer zero points; "
                         f"write the checkpoint again with `dllm-decode quantize`")
    return state, {name[:-len(".weight_q")] for name in state if name.endswith(".weight_q")}


def save_quantized(model: nn.Module, directory: str | Path, config: dict[str, Any],
                   source: Path | None = None, calibration: dict[str, Any] | None = None) -> Path:
    """Write `model` (quantized by `quantize_model`) as a checkpoint `load_model` reads back.

    Args:
        config: the float checkpoint's `config.json` (its `quantization_config` is replaced).
        source: the float checkpoint's folder: its tokenizer and other small files are copied.
        calibration: how the codes were chosen (recorded in `quantization_config`).
    The weights are written first and the config last, each to a temporary file renamed into
    place, so a folder with the new config never holds torn weights.
    """
    from safetensors.torch import save_file

    from dllm_decode.outputs import atomic_write, write_with

    spec = getattr(model, "quantization", None)
    if spec is None:
        raise QuantError("the model is not quantized; call quantize_model first")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if source is not None:
        for path in sorted(Path(source).iterdir()):
            if path.is_file() and path.name != "config.json" and not path.name.endswith(
                    (".safetensors", ".safetensors.index.json", ".bin", ".pt", ".gguf")):
                shutil.copyfile(path, directory / path.name)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    write_with(directory / "model.safetensors",
               lambda tmp: save_file(state, tmp, metadata={"format": "pt"}), "weights")
    quantization = {"quant_method": OWN_METHOD, **spec.to_dict(),
                    "calibration": calibration or {"method": "round-to-nearest"}}
    atomic_write(directory / "config.json",
                 json.dumps({**config, "quantization_config": quantization}, indent=2) + "\n",
                 "model config")
    return directory
