"""Checkpoint I/O that every model family shares: where a named model lives, `config.json`,
safetensors (single file or shards), strict state loading, the tokenizer, and the one-line
`ModelLoadError`.

Confinement: the weights are read only from inside the checkpoint directory: a shard name in
`model.safetensors.index.json` must be a plain relative name (no absolute path, no `..`), and no
weight file may be a symlink leading out of the directory (the HF cache's own `blobs/` folder,
where its snapshot links point, excepted).

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
EMBEDDED_NAMES = {"embedded": "dllm", "embedded-bd": "bd", "embedded-dparallel": "dparallel",
                  "embedded-noise": "noise"}   # CLI names of the shipped models -> directory
EMBEDDED_AR = ("ar_target", "ar_draft")
"""The shipped causal (AR) models (`dllm_decode.models.causal` loads them)."""


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
    if text in EMBEDDED_AR:
        raise ModelLoadError(f"{text!r} is a shipped causal (AR) model, not a diffusion LM; use it "
                             f"as `ar:{text}` (eval) or with `dllm-decode spec --target/--draft`")
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        from dllm_decode.models.hub import snapshot    # the cache, else the Hub (HF_HUB_OFFLINE: cache)

        try:
            return snapshot(text)
        except ValueError as err:
            raise ModelLoadError(str(err)) from None
    raise ModelLoadError(f"model directory {text!r} does not exist (shipped models: "
                         f"{', '.join(EMBEDDED_NAMES)}; a Hub id is ORG/NAME)")


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
MAX_SIZES = {"n_layers": 1024, "num_hidden_layers": 1024, "n_heads": 4096, "num_attention_heads": 4096,
             "n_kv_heads": 4096, "num_key_value_heads": 4096, "num_experts": 4096,
             "vocab_size": 1 << 24, "embedding_size": 1 << 24, "d_model": 1 << 17, "hidden_size": 1 << 17,
             "mlp_hidden_size": 1 << 20, "intermediate_size": 1 << 20, "moe_intermediate_size": 1 << 20,
             "head_dim": 1 << 14, "max_sequence_length": 1 << 24, "max_position_embeddings": 1 << 24}
"""Upper bounds of config.json sizes, checked before anything is built: ten times the largest
public models' values (a config asking for more is corrupt or hostile, and building it would
take minutes and gigabytes before failing)."""
TOKEN_KEYS = ("mask_token_id", "pad_token_id", "eos_token_id")
"""config.json keys that, when present and not null, must be token ids inside the vocabulary."""


def check_config(path: Path, config: dict[str, Any]) -> None:
    """The sizes and special token ids of any family's config.json, checked once on load, so a
    bad value is one line naming the file and key rather than an error deep inside a layer.

    Raises:
        ModelLoadError: a size that is not a positive integer, or a special id that is not an
            integer inside [0, vocabulary size) (an eos list: each id).
    """
    if isinstance(text := config.get("text_config"), dict):
        check_config(path, text)                 # a multimodal layout keeps the sizes nested
    for key in SIZE_KEYS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ModelLoadError(f"{path}: {key} must be a positive integer, got {value!r}")
    for key, bound in MAX_SIZES.items():
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > bound:
            raise ModelLoadError(f"{path}: {key} {value} is beyond any real model (at most {bound}); "
                                 f"the config is corrupt")
    vocab = max(config.get("vocab_size") or 0, config.get("embedding_size") or 0)
    for key in TOKEN_KEYS:
        value = config.get(key)
        for item in (value if isinstance(value, list) and key == "eos_token_id" else [value]):
            if item is None or (key == "pad_token_id" and isinstance(item, int) and item < 0):
                continue                         # no id (a negative pad is a common "none")
            if isinstance(item, bool) or not isinstance(item, int) or item < 0 or (vocab and item >= vocab):
                bound = f"[0, {vocab})" if vocab else "[0, vocabulary size)"
                raise ModelLoadError(f"{path}: {key} {item!r} is outside the vocabulary {bound}")


def require_bool(value: object, name: str) -> bool:
    """`value` when it is a real `bool`; a one-line TypeError otherwise (the string "false" is
    truthy: an opt-in must never be read from a truthy value).

    Raises:
        TypeError: naming the parameter, the value and its type.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def weight_file(directory: Path, name: object, source: Path | None = None) -> Path:
    """The path of a weight file named `name` inside `directory`, checked to stay there.

    Raises:
        ModelLoadError: a name that is not a plain relative path (absolute, `..`, empty, not a
            string), or a file that resolves (through a symlink) outside the directory.
    """
    where = source or directory
    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise ModelLoadError(f"{where}: shard name {name!r} is not a file name")
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts or name.startswith("~"):
        raise ModelLoadError(f"{where}: shard {name!r} lies outside the checkpoint folder (names must "
                             f"be relative, without '..')")
    path = directory / relative
    resolved = path.resolve()
    roots = [directory.resolve()]
    blobs = cache_blobs(directory)
    if blobs is not None:                               # the HF cache links snapshots to its blobs
        roots.append(blobs)
    if not any(resolved == root or root in resolved.parents for root in roots):
        raise ModelLoadError(f"{where}: shard {name!r} links outside the checkpoint folder "
                             f"(to {resolved}); weights are read only from inside it")
    return path


def cache_blobs(directory: Path) -> Path | None:
    """The resolved `blobs` folder of a Hugging Face cache snapshot (`<repo>/snapshots/<rev>`), or
    None when `directory` does not sit in a real cache layout: `snapshots` and `blobs` must be
    plain folders (not links) of one repository folder, so a planted `blobs -> /` opens nothing."""
    snapshots = directory.parent
    if snapshots.name != "snapshots":
        return None
    repo = snapshots.parent
    blobs = repo / "blobs"
    if snapshots.is_symlink() or blobs.is_symlink() or not blobs.is_dir():
        return None
    root, resolved = repo.resolve(), blobs.resolve()
    return resolved if resolved.parent == root else None


def shard_names(directory: Path) -> list[str]:
    """The weight files of a checkpoint: the shards its index names, or `model.safetensors`.

    Raises:
        ModelLoadError: no weights, a broken index, or a shard name that leaves the directory.
    """
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted({str(v) if isinstance(v, str) else v for v in weight_map.values()}, key=repr)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError):
            raise ModelLoadError(f"{index} is not a safetensors index (JSON with a "
                                 f"'weight_map' object)") from None
        for name in files:
            weight_file(directory, name, index)
        return files
    if (directory / "model.safetensors").is_file():
        weight_file(directory, "model.safetensors")
        return ["model.safetensors"]
    raise ModelLoadError(f"{directory} has no model.safetensors or model.safetensors.index.json")


def parameter_floor(config: dict[str, Any]) -> int:
    """A lower bound of a config's parameter count (embedding, attention q/o and two MLP
    matrices per layer; experts counted): a model cannot need less memory than this."""
    def size(*keys: str) -> int:
        value = next((config[k] for k in keys if isinstance(config.get(k), int)), 0)
        return int(value) if not isinstance(value, bool) else 0

    hidden, layers = size("d_model", "hidden_size"), size("n_layers", "num_hidden_layers")
    vocab = max(size("vocab_size"), size("embedding_size"))
    inner = size("mlp_hidden_size", "intermediate_size")
    experts = size("num_experts") * size("moe_intermediate_size")
    return vocab * hidden + layers * (2 * hidden * hidden + 2 * hidden * max(inner, experts))


def available_memory() -> int | None:
    """Bytes of host memory available now (Linux `MemAvailable`), or None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(path: Path, config: dict[str, Any], bytes_per_parameter: int) -> None:
    """Refuse, before anything is allocated, a config whose parameters cannot fit in the memory
    available now (the weights are read into host memory first, whatever the device).

    Raises:
        ModelLoadError: naming the estimate and the free memory.
    """
    need = parameter_floor(config) * bytes_per_parameter
    free = available_memory()
    if free is not None and need > free:
        raise ModelLoadError(f"{path}: the model needs at least {need / 2 ** 30:.1f} GiB for its "
                             f"parameters, and {free / 2 ** 30:.1f} GiB of memory is available")


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Single `model.safetensors` or shards listed in `model.safetensors.index.json`, each
    confined to the directory (`weight_file`)."""
    from safetensors.torch import load_file

    files = shard_names(directory)
    state: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            state.update(load_file(str(weight_file(directory, name))))
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
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
            return set()          # `read_safetensors` reports the broken index
    try:
        with safe_open(str(weight_file(directory, "model.safetensors")), framework="pt") as file:
            return set(file.keys())
    except Exception:  # noqa: BLE001 - a missing, broken or escaping file: `read_safetensors` reports it
        return set()


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def save_checkpoint(directory: str | Path, config: dict[str, Any], model: nn.Module,
                    dtype: torch.dtype = torch.float32) -> None:
    """Write `config.json` and a single `model.safetensors` (the layout `read_safetensors` reads),
    each to a temporary file renamed into place (`dllm_decode.outputs`): the weights first, so a
    folder with the new config never holds torn weights."""
    from safetensors.torch import save_file

    from dllm_decode.outputs import atomic_write, write_with

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # own contiguous copies: the compact runtime leaves weights as views of shared matrices
    state = {k: v.detach().to(dtype).clone(memory_format=torch.contiguous_format)
             for k, v in model.state_dict().items()}
    write_with(directory / "model.safetensors", lambda tmp: save_file(state, tmp, metadata={"format": "pt"}),
               "weights")
    atomic_write(directory / "config.json", json.dumps(config, indent=2) + "\n", "model config")


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
    kinds = [f"{k} is {str(state[k].dtype).removeprefix('torch.')}" for k, v in expected.items()
             if k in state and v.is_floating_point() and not state[k].is_floating_point()]
    if kinds:                 # integer or boolean values are not weights: a quantised format
        raise ModelLoadError(f"{directory}: weights must be floating point ({kinds[0]}); this loader "
                             f"reads float32/bfloat16/float16 (or float8) safetensors, not integer-"
                             f"quantised checkpoints")
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
    require_bool(trust_remote_code, "trust_remote_code")
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
