"""The Learn2PD network (a two-layer MLP over the block's confidences) and its weight files.

Weights are a safetensors file with the tensors of `ConfidenceMLP` and `width`/`hidden` in its
metadata. Loading is cached per (path, modification time), so building a filter or calling it
each step never re-reads the file, while a retrained file is picked up.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

import dllm_decode

SHIPPED = "embedded"
"""Weight name that resolves to the filter trained for the embedded model (package data)."""
SHIPPED_PATH = Path(dllm_decode.__file__).resolve().parent / "embedded" / "filters" / "learned.safetensors"


class ConfidenceMLP(nn.Module):
    """Linear(width -> hidden), ReLU, Linear(hidden -> width): one accept logit per block slot.

    With width = hidden = 32 this has the 2,112 parameters the Learn2PD paper quotes
    (arXiv 2509.25188; the hidden activation is not given in the sources, ReLU assumed).
    """

    def __init__(self, width: int = 32, hidden: int = 32):
        super().__init__()
        self.width, self.hidden = width, hidden
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, confidence: Tensor) -> Tensor:      # (N, width) -> (N, width) logits
        return self.fc2(torch.relu(self.fc1(confidence)))


def weights_path(name: str) -> Path:
    """`embedded` -> the shipped file; anything else is a local file path."""
    return SHIPPED_PATH if name == SHIPPED else Path(name).expanduser()


def save_mlp(module: ConfidenceMLP, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write `module` as safetensors, with its shape (and any `metadata`) in the header, to a
    temporary file renamed into place (`OutputError` for a special file or a full disk)."""
    from dllm_decode.outputs import write_with

    meta = {**(metadata or {}), "width": str(module.width), "hidden": str(module.hidden)}
    state = {k: v.detach().float().contiguous().cpu() for k, v in module.state_dict().items()}
    write_with(path, lambda tmp: save_file(state, tmp, metadata=meta), "filter weights")


def load_mlp(name: str) -> ConfidenceMLP:
    """The frozen, eval-mode MLP stored at `name` (see `weights_path`), cached.

    Raises:
        ValueError: the file is missing, unreadable, or not a ConfidenceMLP.
    """
    path = weights_path(name)
    if not path.is_file():
        hint = " (train it with `dllm-decode train-filter`)" if name == SHIPPED else ""
        raise ValueError(f"learned filter weights not found at {path}{hint}")
    return _load(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int) -> ConfidenceMLP:
    del mtime_ns                                           # part of the cache key only
    try:
        with safe_open(path, "pt") as handle:
            meta = handle.metadata() or {}
        state = load_file(path)
        module = ConfidenceMLP(int(meta["width"]), int(meta["hidden"]))
        module.load_state_dict(state)
    except (SafetensorError, KeyError, ValueError, RuntimeError, OSError) as err:
        raise ValueError(f"learned filter weights at {path} are not a ConfidenceMLP file: "
                         f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    module.requires_grad_(False)
    return module.eval()
