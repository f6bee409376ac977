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
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
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
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{path} is not valid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


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
            raise ModelLoadError(f"cannot read {directory / name}: {_first_line(err)}") from None
    return state


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def save_checkpoint(directory: str | Path, config: dict[str, Any], model: nn.Module,
                    dtype: torch.dtype = torch.float32) -> None:
    """Write `config.json` and a single `model.safetensors` (the layout `read_safetensors` reads)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
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


def _build_native(directory: Path, config: dict[str, Any], config_cls: type, model_cls: type,
                  required: tuple[str, ...], drop: tuple[str, ...] = ()) -> nn.Module:
    """Check the config's size keys, build on the meta device (no random init of billions of
    weights), then take the checkpoint's tensors, minus the `drop` names."""
    if absent := [key for key in required if key not in config]:
        raise ModelLoadError(f"{directory / 'config.json'} lacks required key(s) {absent}")
    try:
        parsed = config_cls.from_dict(config)
    except (ValueError, TypeError) as err:
        raise ModelLoadError(f"{directory / 'config.json'}: {_first_line(err)}") from None
    with torch.device("meta"):
        model = model_cls(parsed)
    state = read_safetensors(directory)
    for name in drop:
        state.pop(name, None)
    load_state_strict(model, state, directory, assign=True)
    return model


def _build_llada(directory: Path, config: dict[str, Any]) -> nn.Module:
    from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM

    return _build_native(directory, config, LLaDAConfig, LLaDAModelLM,
                         ("d_model", "n_heads", "n_layers", "mlp_hidden_size", "vocab_size"))


def _build_dream(directory: Path, config: dict[str, Any]) -> nn.Module:
    from dllm_decode.models.dream import DreamConfig, DreamModel

    # A tied checkpoint may still carry a copy of the head; the model reads the embedding.
    drop = ("lm_head.weight",) if config.get("tie_word_embeddings") else ()
    return _build_native(directory, config, DreamConfig, DreamModel,
                         ("hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "vocab_size"), drop)


BUILDERS: dict[str, Callable[[Path, dict[str, Any]], nn.Module]] = {   # key: lower-case model_type
    "llada": _build_llada,
    "dream": _build_dream,
}


def _model_kind(config: dict[str, Any]) -> str:
    """"masked", "causal" or "unknown", from `architectures` first, then `model_type`."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    architectures = config.get("architectures") or []
    if any(str(name).endswith("ForMaskedLM") for name in architectures):
        return "masked"
    if any(str(name).endswith(("ForCausalLM", "LMHeadModel")) for name in architectures):
        return "causal"
    model_type = config.get("model_type")
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.get("is_encoder_decoder"):
        return "masked"
    return "causal" if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else "unknown"


def load_tokenizer(directory: Path):
    """The directory's tokenizer (offline), or None when it ships none."""
    if not any((directory / name).is_file() for name in
               ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt")):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()    # it warns that config.json's `llada`/`Dream` type is unknown to it
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True,
                                             trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - tokenizer loading errors vary by class
        raise ModelLoadError(f"cannot load the tokenizer in {directory}: {_first_line(err)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)


TURN_END_TOKENS = ("<|eot_id|>", "<|im_end|>")   # LLaDA-Instruct, Dream-Instruct: end of the answer


def turn_end_ids(tokenizer, known: tuple[int, ...]) -> tuple[int, ...]:
    """Chat end-of-turn ids the tokenizer defines (they end an answer like EOS), minus `known`."""
    if tokenizer is None:
        return ()
    vocab = tokenizer.get_vocab()
    return tuple(vocab[t] for t in TURN_END_TOKENS if t in vocab and vocab[t] not in known)


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
        ModelLoadError: missing or corrupt directory, bad config, unsupported model type (a
            causal LM included), tokenizer without a mask token for a generic masked LM.
    """
    directory = resolve_model_dir(path)
    config = read_config(directory)
    model_type = config.get("model_type")
    builder = BUILDERS.get(str(model_type).lower())
    if builder is None and (kind := _model_kind(config)) != "masked":
        if kind == "causal":
            raise ModelLoadError(f"{directory}: model_type {model_type!r} is a causal "
                                 f"(autoregressive) LM; diffusion decoding needs a masked LM (LLaDA, "
                                 f"Dream or a transformers *ForMaskedLM); use it with the "
                                 f"AR/speculative mode")
        raise ModelLoadError(f"{directory}: model_type {model_type!r} is not a diffusion LM this "
                             f"toolkit loads; supported: {sorted(BUILDERS)} or any transformers "
                             f"masked LM")
    tokenizer = load_tokenizer(directory)
    if builder is not None:
        model = builder(directory, config)
    else:                                                # generic fallback: any transformers MLM
        from dllm_decode.models.hf import load_masked_lm

        model = load_masked_lm(directory, tokenizer)
    model = model.to(dtype=dtype or torch.float32, device=device or "cpu").eval()
    model.tokenizer = tokenizer
    model.eos_token_ids = model.eos_token_ids + turn_end_ids(tokenizer, model.eos_token_ids)
    model.name_or_path = str(path)
    return model
