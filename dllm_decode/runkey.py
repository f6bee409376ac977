"""What a resumable output records of the run that wrote it, and the check a resume makes.

A batch output (`dllm-decode --input/--output`) and an evaluation folder (`dllm-decode eval`)
skip work already written. That is only right when the model and the decode record are the
ones the written answers came from: each written result records its run (`run_record`), and a
resume with another model or other decode settings is an error naming what changed
(`check_resume`), never old answers kept beside new ones.

The model's identity is its name and, for a checkpoint directory, the SHA-256 of `config.json`
and the names and sizes of its weight files (cheap: no weight is read; a retrained checkpoint
of the same name and sizes is told apart by the user, `--output` elsewhere).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def model_identity(name: str) -> dict[str, Any]:
    """The identity of the model a `--model` text names (see the module docstring)."""
    identity: dict[str, Any] = {"name": name}
    directory = model_directory(name)
    if directory is None:
        return identity
    config = Path(directory) / "config.json"
    if config.is_file():
        identity["config_sha256"] = hashlib.sha256(config.read_bytes()).hexdigest()
        identity["weights"] = {p.name: p.stat().st_size for p in sorted(Path(directory).glob("*.safetensors"))}
    return identity


LOAD_KEYS = ("quantize", "adapters", "dtype", "chat_template", "attention", "kv_cache_dtype")
"""How a run loads the model and wraps its prompts, beyond the checkpoint itself: each changes
the answers, so each is part of the model identity (recorded only when not the default, so a
plain run's identity stays the checkpoint's)."""


def load_identity(quantize: str | None = None, adapters: Any = (), dtype: str | None = None,
                  chat_template: bool = True, attention: str | None = None,
                  kv_cache_dtype: str = "auto") -> dict[str, Any]:
    """The `LOAD_KEYS` entries of a run that sets them: the quantization, each adapter folder's
    identity (its config's hash and weight sizes), the dtype, a chat template turned off, the
    attention back end, a low-precision KV cache."""
    out: dict[str, Any] = {}
    if quantize:
        out["quantize"] = str(quantize)
    if adapters:
        out["adapters"] = [_adapter_identity(a) for a in adapters]
    if dtype:
        out["dtype"] = str(dtype)
    if not chat_template:
        out["chat_template"] = False
    if attention:
        out["attention"] = str(attention)
    if kv_cache_dtype != "auto":
        out["kv_cache_dtype"] = kv_cache_dtype
    return out


def _adapter_identity(folder: Any) -> dict[str, Any]:
    path = Path(str(folder))
    config = path / "adapter_config.json"
    identity: dict[str, Any] = {"name": path.name}
    try:
        identity["config_sha256"] = hashlib.sha256(config.read_bytes()).hexdigest()
        identity["weights"] = {p.name: p.stat().st_size for p in sorted(path.glob("*.safetensors"))}
    except OSError:
        pass
    return identity


def model_directory(name: str) -> Path | None:
    """The checkpoint folder a `--model` text names (None: not a folder, such as `ideal`)."""
    base = name.split("@", 1)[0].split(":", 1)[0]
    try:
        from dllm_decode.models.checkpoint import resolve_model_dir

        return Path(resolve_model_dir(base))
    except Exception:  # noqa: BLE001 - not a checkpoint directory (ideal, tiny, a causal LM name)
        return None


def run_record(model: dict[str, Any], decode: Any) -> dict[str, Any]:
    """The run a result was written by: the model identity and the decode record (a
    `DecodeConfig`, or its `to_dict`)."""
    return {"model": model, "decode": decode.to_dict() if hasattr(decode, "to_dict") else decode}


def what_changed(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human words for each difference between two run records (empty: the same run)."""
    changes = []
    old_model, new_model = recorded.get("model") or {}, current.get("model") or {}
    if old_model.get("name") != new_model.get("name"):
        changes.append(f"model {old_model.get('name')!r} -> {new_model.get('name')!r}")
    elif old_model != new_model:
        loaded = [f"{key} {_short(old_model.get(key))} -> {_short(new_model.get(key))}"
                  for key in LOAD_KEYS if old_model.get(key) != new_model.get(key)]
        changes.extend(loaded or [f"model {new_model.get('name')!r} (its config or weights differ)"])
    old, new = recorded.get("decode"), current.get("decode")
    if old is not None and new is not None:
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                changes.append(f"{key} {_short(old.get(key))} -> {_short(new.get(key))}")
    return changes


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_resume(recorded: dict[str, Any] | None, current: dict[str, Any], where: str, hint: str) -> None:
    """Refuse to resume `where` written by another run.

    Raises:
        ValueError: one line naming what changed and `hint` (how to start a new output).
    """
    if recorded is None:
        return
    changes = what_changed(recorded, current)
    if changes:
        raise ValueError(f"{where} was written by another run ({'; '.join(changes)}); resuming would "
                         f"mix its answers with this run's: {hint}")
