"""Per-rank loading: each rank reads only its slices of the safetensors files.

`safe_open(file).get_slice(name)[a:b]` (and `[:, a:b]`) is a view of the memory-mapped file;
copying it into the rank's parameter allocates exactly the slice. The model is built on the meta
device, sharded there (`plan.shard_model`), and each parameter is filled from its file, named by
`model.safetensors.index.json`'s `weight_map` (or the single `model.safetensors`). No rank ever
holds a whole copy of the weights; the touched file pages sit in the page cache (shared,
evictable). Tensors keep the checkpoint's dtype unless a dtype is given.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from dllm_decode.parallel.groups import ParallelGroups
from dllm_decode.parallel.plan import Reader, Slice, placed, shard_model, take


def weight_map(directory: Path) -> dict[str, str]:
    """Tensor name -> the file (relative to `directory`) that holds it."""
    from dllm_decode.models.checkpoint import ModelLoadError, shard_names, weight_file

    files = shard_names(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        mapping = json.loads(index.read_text())["weight_map"]
        return {str(k): str(v) for k, v in mapping.items()}
    from safetensors import safe_open

    try:
        with safe_open(str(weight_file(directory, files[0])), framework="pt") as handle:
            return {name: files[0] for name in handle.keys()}
    except Exception as err:  # noqa: BLE001 - safetensors raises several types for bad files
        raise ModelLoadError(f"cannot read {directory / files[0]}: {err}") from None


class CheckpointReader:
    """A `plan.Reader` over a checkpoint directory: opens each file once (memory-mapped) and
    copies only the asked slices into owned tensors. Use as a context manager."""

    def __init__(self, directory: Path, rank: int):
        self.directory, self.rank = directory, rank
        self.files = weight_map(directory)
        self._stack = ExitStack()
        self._open: dict[str, Any] = {}

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
        self._open.clear()

    def handle(self, name: str) -> Any:
        from safetensors import safe_open

        from dllm_decode.models.checkpoint import ModelLoadError, weight_file

        if name not in self.files:
            raise ModelLoadError(f"{self.directory}: weights do not match the config (missing "
                                 f"{name})")
        file = self.files[name]
        if file not in self._open:
            path = str(weight_file(self.directory, file))
            self._open[file] = self._stack.enter_context(safe_open(path, framework="pt"))
        return self._open[file]

    def __call__(self, name: str, part: Slice, shape: tuple[int, ...]) -> Tensor:
        from dllm_decode.models.checkpoint import ModelLoadError

        lazy = self.handle(name).get_slice(name)
        if tuple(lazy.get_shape()) != tuple(shape):
            raise ModelLoadError(f"{self.directory}: weights do not match the config (shape of "
                                 f"{name} {tuple(lazy.get_shape())} != {tuple(shape)})")
        dtype = _DTYPES.get(lazy.get_dtype(), torch.float32)
        return placed(take(lazy, part, self.rank), part, shape, dtype)


_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "BOOL": torch.bool, "U8": torch.uint8}


def load_sharded(model: nn.Module, directory: Path, groups: ParallelGroups,
                 dtype: torch.dtype | None = None, drop: tuple[str, ...] = (),
                 checked: Callable[[CheckpointReader], Reader] | None = None) -> nn.Module:
    """Shard a meta-device `model` over `groups` and fill it with this rank's slices of the
    checkpoint in `directory` (names the checkpoint has but the model does not, other than
    `drop`, are an error, as in a whole load). `checked(reader)`, when given, is the reader the
    slices come through (a family's own checks on them: DiffusionGemma's tied copies).

    Raises:
        ModelLoadError: a missing tensor, a shape that does not match, an unexpected tensor.
        ParallelError: a size the model cannot be split into.
    """
    from dllm_decode.models.checkpoint import ModelLoadError

    expected = set(model.state_dict())
    with CheckpointReader(directory, groups.tp_rank) as reader:
        unexpected = sorted(set(reader.files) - expected - set(drop))
        if unexpected:
            raise ModelLoadError(f"{directory}: weights do not match the config (unexpected "
                                 f"{unexpected[:3]})")
        read: Reader = reader if checked is None else checked(reader)
        return shard_model(model, groups, read, dtype)


def resident_weight_bytes(model: nn.Module) -> int:
    """Bytes of the parameters and buffers this process holds (each storage counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen and tensor.device.type != "meta":
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total
