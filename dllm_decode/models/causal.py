"""Causal LMs for the AR / speculative mode: the embedded Llama-format pair, local checkpoints,
SmolLM2 (GGUF).

The causal family beside the diffusion families of `models.loading.BUILDERS`: `build_causal`
takes the same `(directory, config)` as a `BUILDERS` entry, and the model types it covers are
the ones transformers' `AutoModelForCausalLM` knows (its table is this family's registry; no
causal architecture is re-implemented here). `load_causal_lm` resolves a name the way
`load_model` does, plus the two GGUF sources (`models.gguf`). Nothing is downloaded here:
`smollm2` must have been fetched (`dllm-decode fetch smollm2`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dllm_decode.models.checkpoint import (EMBEDDED_AR, EMBEDDED_DIR, ModelLoadError, custom_code,
                                           load_tokenizer, read_config, require_bool, resolve_model_dir,
                                           untrusted_code_error)
from dllm_decode.models.gguf import WHEEL_MODELS, FetchError, gguf_path, load_gguf

# EMBEDDED_AR: the shipped AR models, in `dllm_decode/embedded/<name>/` (same tokenizer as the
# embedded dLLM); declared beside the shipped dLLM names in `models.checkpoint`.


def resolve_causal_dir(name: str) -> Path:
    """`ar_target` / `ar_draft`, a local directory, or a repo id in the local HF cache."""
    if name in EMBEDDED_AR:
        for directory in (EMBEDDED_DIR / name, EMBEDDED_DIR / name / "model"):
            if (directory / "config.json").is_file():
                return directory
        raise ModelLoadError(f"the embedded AR model {name!r} is not installed at {EMBEDDED_DIR / name}")
    return resolve_model_dir(name)


def load_causal_lm(name: str | Path, dtype: torch.dtype = torch.float32,
                   device: str | torch.device | None = None, trust_remote_code: bool = False) -> Any:
    """A transformers causal LM in eval mode with `.tokenizer` (None if it ships none).

    Args:
        name: `smollm2` (the fetched GGUF), `ar_target`, `ar_draft`, a `.gguf` file, a local
            checkpoint directory, or a repo id already in the local HF cache.
        trust_remote_code: allow a checkpoint directory's own model/tokenizer code.
    Raises:
        ModelLoadError: missing model, a directory that is not a causal LM, or a GGUF problem
            (one-line message).
        TypeError: `trust_remote_code` that is not a bool (the string "false" is truthy).
    """
    require_bool(trust_remote_code, "trust_remote_code")
    text = str(name)
    try:
        if text in WHEEL_MODELS:
            model = load_gguf(gguf_path(text), dtype)
        elif text.endswith(".gguf"):
            model = load_gguf(Path(text).expanduser(), dtype)
        else:
            directory = resolve_causal_dir(text)
            model = build_causal(directory, read_config(directory), dtype, trust_remote_code)
    except FetchError as err:
        raise ModelLoadError(str(err)) from None
    model.name_or_path = text
    return model.to(device or "cpu").eval()


def build_causal(directory: Path, config: dict[str, Any], dtype: torch.dtype = torch.float32,
                 trust_remote_code: bool = False) -> Any:
    """A transformers causal LM (with `.tokenizer`) from a checkpoint directory and its parsed
    `config.json`: the `BUILDERS` signature, plus the dtype and the remote-code opt-in.

    Raises:
        ModelLoadError: not a causal LM, custom code without `trust_remote_code`, or weights
            that do not load (one line).
        TypeError: `trust_remote_code` that is not a bool.
    """
    from transformers import AutoModelForCausalLM

    require_bool(trust_remote_code, "trust_remote_code")
    architectures = config.get("architectures") or []
    if architectures and not any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        raise ModelLoadError(f"{directory}: {architectures[0]} is not a causal LM; the AR mode "
                             f"needs a transformers *ForCausalLM checkpoint")
    reference = custom_code(directory, "config.json", "AutoModelForCausalLM")
    if reference and not trust_remote_code:
        raise untrusted_code_error(directory, "model", reference)
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()     # its load report of mismatched tensors: we say it in one line
    hf_logging.disable_progress_bar()    # and a weights bar before a later one-line error
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True,
                                                     trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"cannot load a causal LM from {directory}: {first}") from None
    except RuntimeError as err:              # transformers: tensor shapes differ from the config
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "ignore_mismatched_sizes" in first:          # it points at a report we keep quiet
            first = _shape_mismatch(directory, config)
        raise ModelLoadError(f"{directory}: weights do not match config.json ({first[:200]})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    model.tokenizer = load_tokenizer(directory, trust_remote_code)
    return model


def _shape_mismatch(directory: Path, config: dict[str, Any]) -> str:
    """Which size disagrees, read from the safetensors header (no weights loaded)."""
    try:
        from safetensors import safe_open

        with safe_open(str(directory / "model.safetensors"), framework="pt") as file:
            for name in file.keys():
                if name.endswith("embed_tokens.weight"):
                    rows, width = file.get_slice(name).get_shape()
                    return (f"{name} is {rows} x {width}; config.json says vocab_size "
                            f"{config.get('vocab_size')}, hidden_size {config.get('hidden_size')}")
    except Exception:  # noqa: BLE001 - a sharded or unreadable file: say it plainly
        pass
    return "tensor shapes differ from the sizes config.json gives"

