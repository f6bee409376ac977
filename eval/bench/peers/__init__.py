"""The field's reference decode loops, run side by side with this project's on the same weights.

A peer is a local checkout of another project (never part of this one): `bench shaped --peer
fast-dllm=PATH` points at a checkout of NVlabs/Fast-dLLM, and each of its loops that the checkout
holds runs unmodified through a thin wrapper here, at the benchmark's policy (low-confidence,
a fixed number of steps per block, greedy) and NFE. A wrapper imports the peer's own files from
the checkout, builds the peer's own model class from this project's model config, loads this
project's weights into it (same names: both follow the released checkpoints), and reports the
checkout's git commit beside every figure.

* `fast-dllm-v1`: Fast-dLLM v1's `generate_with_dual_cache` (`llada/generate.py`) on its own
  LLaDA (`llada/model/modeling_llada.py`), the `dual` cache's counterpart; one prompt per call.
* `fast-dllm-v2`: Fast-dLLM v2's `batch_sample` (`v2/generation_functions.py`) bound to its
  block-diffusion Qwen2 model (`v2/modeling.py` and `v2/configuration.py` in the checkout: the
  release ships them in its model repository), the `block` cache's counterpart.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PeerLoop:
    """One reference loop: the model family and cache it matches, the file that marks it in a
    checkout, and the module that wraps it (its `load(root, model, options) -> decode`)."""

    name: str
    family: str
    cache: str
    marker: str
    module: str


PEER_LOOPS = {loop.name: loop for loop in (
    PeerLoop("fast-dllm-v1", "llada", "dual", "llada/generate.py", "dllm_decode.eval.bench.peers.fast_dllm_v1"),
    PeerLoop("fast-dllm-v2", "block", "block", "v2/generation_functions.py",
             "dllm_decode.eval.bench.peers.fast_dllm_v2"),
)}
CHECKOUTS = {"fast-dllm": ("fast-dllm-v1", "fast-dllm-v2")}
"""`--peer NAME=PATH` names: the loops each checkout may hold."""
PEERS = PEER_LOOPS


@dataclass(frozen=True)
class Peer:
    """A loaded peer loop: the checkout's commit and `decode(prompts) -> Outcome`."""

    commit: str
    decode: Callable[[list[list[int]]], Any]


def parse_peer(text: str) -> tuple[str, str]:
    """`NAME=PATH` -> (name, path) for `--peer`.

    Raises:
        ValueError: no `=`, an unknown name, or a path that is not a directory.
    """
    name, sep, path = text.partition("=")
    if not sep or not path:
        raise ValueError(f"--peer takes NAME=PATH (a local checkout), got {text!r}; names: {sorted(CHECKOUTS)}")
    if name not in CHECKOUTS:
        raise ValueError(f"unknown peer {name!r}; known: {sorted(CHECKOUTS)}")
    if not Path(path).is_dir():
        raise ValueError(f"peer {name}: {path!r} is not a directory (a local checkout)")
    return name, path


def loops_in(name: str, path: str) -> list[str]:
    """The loops of checkout `name` present under `path` (by their marker files)."""
    return [loop for loop in CHECKOUTS[name] if (Path(path) / PEER_LOOPS[loop].marker).is_file()]


def checkout_commit(path: str | Path) -> str:
    """The checkout's git commit (`git rev-parse HEAD`); for an exported copy without `.git`, the
    commit its `.git-commit` file names; else `unknown (not a git checkout)`."""
    try:
        top = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        own = top.returncode == 0 and Path(top.stdout.strip()).resolve() == Path(path).resolve()
        done = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10) if own else None      # a folder inside another repository is not one
        if done is not None and done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    recorded = Path(path) / ".git-commit"
    if recorded.is_file() and recorded.read_text().strip():
        return f"{recorded.read_text().split()[0]} (from .git-commit)"
    return "unknown (not a git checkout)"


def load_peer(loop: str, path: str, model: Any, options: Any) -> Peer:
    """Loop `loop` of the checkout at `path`, on `model`'s weights, at `options`' policy.

    Raises:
        ImportError, OSError, ValueError...: what the peer's files raise when they cannot load
        here (the benchmark prints it on the peer's row).
    """
    import importlib

    spec = PEER_LOOPS[loop]
    if not (Path(path) / spec.marker).is_file():
        raise ValueError(f"{path} has no {spec.marker}")
    decode = importlib.import_module(spec.module).load(Path(path), model, options)
    return Peer(checkout_commit(path), decode)
