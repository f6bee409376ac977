"""A Hugging Face Hub repo id (`ORG/NAME`) -> a local checkpoint directory, as `from_pretrained`
resolves one: the local cache first, then a download from the Hub (or from `HF_ENDPOINT`, a
mirror). `HF_HUB_OFFLINE=1` keeps to the cache. Only what loading reads is fetched: the config,
the safetensors weights, the tokenizer and generation files, and the checkpoint's own Python
files (which run only under `trust_remote_code`); duplicate weight formats (`*.bin`, `*.pth`,
`*.gguf`, ...) are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.py", "*.jinja"]
"""The files `load_model` can use; everything else in a repo (other weight formats, images,
training logs) stays on the Hub."""

TRUE = ("1", "true", "yes", "on")


def offline() -> bool:
    """`HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is set: the cache only, no network."""
    return any(os.environ.get(name, "").strip().lower() in TRUE
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def looks_like_repo_id(text: str) -> bool:
    """`ORG/NAME`: one slash, not a relative or absolute path."""
    return text.count("/") == 1 and not text.startswith((".", "/", "~")) and all(text.split("/"))


def snapshot(repo_id: str) -> Path:
    """The checkpoint directory of `repo_id`: from the local HF cache when it is there,
    otherwise downloaded (unless offline).

    Raises:
        ValueError: not in the cache while offline, no such repo (or no access to it), or the
            download failed; one line naming the repo id and the endpoint.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    except Exception as err:  # noqa: BLE001 - a malformed id or a broken cache entry
        raise ValueError(f"model {repo_id!r}: {first_line(err)}") from None
    if offline():
        raise ValueError(f"model {repo_id!r} is neither a local directory nor in the local HF cache, "
                         f"and HF_HUB_OFFLINE is set (unset it to download from the Hub)")
    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    try:
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS))
    except Exception as err:  # noqa: BLE001 - every failure is one line for the user
        raise ValueError(f"model {repo_id!r} is not in the local HF cache and downloading it from "
                         f"{endpoint} failed: {first_line(err)}") from None


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
