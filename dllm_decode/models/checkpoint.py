"""Checkpoint I/O that every model family shares: where a named model lives, `config.json`,
safetensors (single file or shards), strict state loading, the tokenizer, and the one-line
`ModelLoadError`.

Custom code: a directory whose `tokenizer_config.json` (or, for the generic masked-LM fallback,
`config.json`) maps an auto class to a Python file of its own (`auto_map`, as the real
Dream-v0 repository does for `DreamTokenizer`) runs that file when loaded. That is opt-in, as in
transformers: `trust_remote_code=True` (CLI `--trust-remote-code`); without it the load stops
with an error naming the class and the flag.

`loading.py` picks a model family from the config; the families use this module to save and
load, so neither imports the other's dispatcher (no import circle).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

EMBEDDED_DIR = Path(__file__).resolve().parent.parent / "embedded"
EMBEDDED_NAMES = {"embedded": "dllm", "embedded-bd": "bd", "embedded-dparallel": "dparallel"}   # CLI names of the shipped models -> directory


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
    if not text.strip():
        raise ModelLoadError("the model name is empty; give a model directory or a shipped name "
                             f"({', '.join(sorted(EMBEDDED_NAMES))})")
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelLoadError(f"model {text!r} is a file, not a directory (a checkpoint directory "
                             f"holds config.json and the weights)")
    if text in ("ar_target", "ar_draft"):
        raise ModelLoadError(f"{text!r} is a shipped causal (AR) model, not a diffusion LM; use it "
                             f"as `ar:{text}` (eval) or with `dllm-decode spec --target/--draft`")
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        from dllm_decode.models.hub import snapshot    # the cache, else the Hub (HF_HUB_OFFLINE: cache)

        try:
            return snapshot(text)
        except ValueError as err:
            raise ModelLoadError(str(err)) from None
    raise ModelLoadError(f"model directory {text!r} does not exist")


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{directory} has no config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{path} is not valid JSON ({err.msg}, line {err.lineno})") from None
    except UnicodeDecodeError as err:
        raise ModelLoadError(f"{path} is not UTF-8 text (byte {err.start})") from None
    except RecursionError:
        raise ModelLoadError(f"{path} is nested too deeply to be a model config") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} must hold a JSON object, got {type(config).__name__}")
    check_config(path, config)
    return config


SIZE_KEYS = ("vocab_size", "embedding_size", "d_model", "n_heads", "n_kv_heads", "n_layers",
             "mlp_hidden_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "intermediate_size", "head_dim", "max_sequence_length",
             "max_position_embeddings", "bd_size", "block_size")
"""config.json keys that, when present and not null, must be positive integers (every family)."""
TOKEN_KEYS = ("mask_token_id", "pad_token_id", "eos_token_id")
"""config.json keys that, when present and not null, must be token ids inside the vocabulary."""


def check_config(path: Path, config: dict[str, Any]) -> None:
    """The sizes and special token ids of any family's config.json, checked once on load, so a
    bad value is one line naming the file and key rather than an error deep inside a layer.

    Raises:
        ModelLoadError: a size that is not a positive integer, or a special id that is not an
            integer inside [0, vocabulary size) (an eos list: each id).
    """
    for key in SIZE_KEYS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ModelLoadError(f"{path}: {key} must be a positive integer, got {value!r}")
    vocab = max(config.get("vocab_size") or 0, config.get("embedding_size") or 0)
    for key in TOKEN_KEYS:
        value = config.get(key)
        for item in (value if isinstance(value, list) and key == "eos_token_id" else [value]):
            if item is None or (key == "pad_token_id" and isinstance(item, int) and item < 0):
                continue                         # no id (a negative pad is a common "none")
            if isinstance(item, bool) or not isinstance(item, int) or item < 0 or (vocab and item >= vocab):
                bound = f"[0, {vocab})" if vocab else "[0, vocabulary size)"
                raise ModelLoadError(f"{path}: {key} {item!r} is outside the vocabulary {bound}")


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Single `model.safetensors` or shards listed in `model.safetensors.index.json`."""
    from safetensors.torch import load_file

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise ModelLoadError(f"{index} is not a safetensors index (JSON with a "
                                 f"'weight_map' object)") from None
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ModelLoadError(f"{directory} has no model.safetensors or model.safetensors.index.json")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            state.update(load_file(str(directory / name)))
        except Exception as err:  # noqa: BLE001 - safetensors raises several types for bad files
            raise ModelLoadError(f"cannot read {directory / name}: {first_line(err)}") from None
    return state


def tensor_names(directory: Path) -> set[str]:
    """Names of the checkpoint's tensors, read from the headers only (no weights loaded)."""
    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            return set(json.loads(index.read_text())["weight_map"])
        except (json.JSONDecodeError, KeyError, TypeError):
            return set()          # `read_safetensors` reports the broken index
    try:
        with safe_open(str(directory / "model.safetensors"), framework="pt") as file:
            return set(file.keys())
    except Exception:  # noqa: BLE001 - a missing or broken file is reported by `read_safetensors`
        return set()


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def save_checkpoint(directory: str | Path, config: dict[str, Any], model: nn.Module,
                    dtype: torch.dtype = torch.float32) -> None:
    """Write `config.json` and a single `model.safetensors` (the layout `read_safetensors` reads)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # own contiguous copies: the compact runtime leaves weights as views of shared matrices
    state = {k: v.detach().to(dtype).clone(memory_format=torch.contiguous_format)
             for k, v in model.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


def load_state_strict(model: nn.Module, state: dict[str, torch.Tensor], directory: Path,
                      assign: bool = False) -> None:
    """Load `state` into `model`; any missing, unexpected or wrongly shaped tensor is an error.

    `assign=True` takes the tensors themselves (for a model built on the meta device).
    """
    expected = model.state_dict()
    wrong = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
             if k in state and state[k].shape != v.shape]
    if wrong:
        raise ModelLoadError(f"{directory}: weights do not match the config (shape of {wrong[0]})")
    missing, unexpected = model.load_state_dict(state, strict=False, assign=assign)
    if missing or unexpected:
        raise ModelLoadError(f"{directory}: weights do not match the config "
                             f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")


TRUST_FLAG = "--trust-remote-code"
"""The CLI flag that opts in to running a checkpoint's own code (API: `trust_remote_code=True`)."""


def custom_code(directory: Path, filename: str, auto_class: str) -> str | None:
    """The `module.Class` a directory's `filename` maps `auto_class` to (its own code), or None."""
    path = directory / filename
    try:
        auto_map = json.loads(path.read_text()).get("auto_map") if path.is_file() else None
    except (json.JSONDecodeError, AttributeError):
        return None
    entry = auto_map.get(auto_class) if isinstance(auto_map, dict) else None
    if isinstance(entry, (list, tuple)):
        entry = next((e for e in entry if e), None)
    return entry if isinstance(entry, str) else None


def untrusted_code_error(directory: Path, what: str, reference: str | None) -> ModelLoadError:
    """The one-line error for custom code that was not opted in to."""
    named = f" ({reference}, a file in the directory)" if reference else ""
    return ModelLoadError(f"the {what} in {directory} needs its own code{named}; if you trust it, "
                          f"pass {TRUST_FLAG} (API: trust_remote_code=True)")


def load_tokenizer(directory: Path, trust_remote_code: bool = False):
    """The directory's tokenizer (offline), or None when it ships none.

    Args:
        trust_remote_code: allow a tokenizer class defined by a Python file in the directory.
    Raises:
        ModelLoadError: the tokenizer needs its own code and `trust_remote_code` is False, or it
            cannot be loaded.
    """
    if not any((directory / name).is_file() for name in
               ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt")):
        return None
    reference = custom_code(directory, "tokenizer_config.json", "AutoTokenizer")
    if reference and not trust_remote_code:
        raise untrusted_code_error(directory, "tokenizer", reference)
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()    # it warns that config.json's `llada`/`Dream` type is unknown to it
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True,
                                             trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001 - tokenizer loading errors vary by class
        if not trust_remote_code and "trust_remote_code" in str(err):
            raise untrusted_code_error(directory, "tokenizer", None) from None
        raise ModelLoadError(f"cannot load the tokenizer in {directory}: {first_line(err)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
