"""`load_model`: a local checkpoint directory (or the local HF cache, offline) -> a DiffusionLM.

The implementation is chosen from `config.json`'s `model_type`; nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

EMBEDDED_DIR = Path(__file__).resolve().parent.parent / "embedded"
EMBEDDED_NAMES = {"embedded": "dllm"}   # CLI names of the shipped models -> directory


class ModelLoadError(ValueError):
    """A model directory is missing, incomplete or of an unsupported kind (one-line message)."""


def resolve_model_dir(name_or_path: str | Path) -> Path:
    """A shipped model name, a local directory, or a repo id already in the local HF cache."""
    text = str(name_or_path)
    if text in EMBEDDED_NAMES:
        path = EMBEDDED_DIR / EMBEDDED_NAMES[text]
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"the embedded model is not installed at {path}")
        return path
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if text.count("/") == 1 and not path.exists():
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(text, local_files_only=True))
        except Exception:  # noqa: BLE001 - any miss in the offline cache is the same user error
            raise ModelLoadError(f"model {text!r} is neither a local directory nor in the local "
                                 f"HF cache (nothing is downloaded)") from None
    raise ModelLoadError(f"model directory {text!r} does not exist")


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{directory} has no config.json")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{path} is not valid JSON ({err.msg}, line {err.lineno})") from None


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Single `model.safetensors` or shards listed in `model.safetensors.index.json`."""
    from safetensors.torch import load_file

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ModelLoadError(f"{directory} has no model.safetensors or model.safetensors.index.json")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            state.update(load_file(str(directory / name)))
        except Exception as err:  # noqa: BLE001 - safetensors raises several types for bad files
            raise ModelLoadError(f"cannot read {directory / name}: {err}") from None
    return state


def load_state_strict(model: nn.Module, state: dict[str, torch.Tensor], directory: Path) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"{directory}: weights do not match the config "
                             f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")


def _build_llada(directory: Path, config: dict[str, Any]) -> nn.Module:
    from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM

    model = LLaDAModelLM(LLaDAConfig.from_dict(config))
    load_state_strict(model, read_safetensors(directory), directory)
    return model


BUILDERS: dict[str, Callable[[Path, dict[str, Any]], nn.Module]] = {
    "llada": _build_llada,
}


def load_tokenizer(directory: Path):
    """The directory's tokenizer (offline), or None when it ships none."""
    if not any((directory / name).is_file() for name in
               ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True,
                                             trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - tokenizer loading errors vary by class
        raise ModelLoadError(f"cannot load the tokenizer in {directory}: {err}") from None


def load_model(path: str | Path, dtype: torch.dtype | None = None,
               device: str | torch.device | None = None) -> nn.Module:
    """Load a DiffusionLM from a local directory, a shipped name (`embedded`) or the HF cache.

    Args:
        path: directory with `config.json` + safetensors (+ tokenizer files), or a name.
        dtype: parameter dtype (default: float32).
        device: target device (default: CPU).
    Returns:
        The model in eval mode, with `.tokenizer` set (None when the directory has none) and
        `.name_or_path` recording where it came from.
    Raises:
        ModelLoadError: missing or corrupt directory, unsupported model type.
    """
    directory = resolve_model_dir(path)
    config = read_config(directory)
    kind = str(config.get("model_type", "")).lower()
    builder = BUILDERS.get(kind)
    if builder is None:
        raise ModelLoadError(f"{directory}: model_type {config.get('model_type')!r} is not a "
                             f"diffusion LM this toolkit loads; supported: {sorted(BUILDERS)}")
    model = builder(directory, config)
    model = model.to(dtype=dtype or torch.float32, device=device or "cpu").eval()
    model.tokenizer = load_tokenizer(directory)
    model.name_or_path = str(path)
    return model
