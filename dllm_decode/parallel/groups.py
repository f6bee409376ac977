"""Process groups for tensor parallelism (TP) and TP x DP, from the environment `torchrun` sets.

The world of `WORLD_SIZE` ranks is a (dp, tp) mesh with tp the fast dimension: TP group g holds
the consecutive ranks [g * tp, (g + 1) * tp) (one node's GPUs, on NVLink), DP group j holds the
ranks with tp rank j. The model is sharded over the TP group; data (prompts, eval samples) is
split over the DP index. `tensor_parallel=1` in a single process joins nothing: every accessor
answers as rank 0 of 1 and no collective runs.

Backend: NCCL for CUDA devices, gloo otherwise (the CPU path is a correctness path: the tests in
`tests/distributed/` run it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class ParallelError(ValueError):
    """A tensor-parallel size that does not fit the world or the model (one-line message)."""


@dataclass(frozen=True)
class ParallelGroups:
    """Where this process sits in the (dp, tp) mesh.

    Attributes:
        tp, dp: the sizes (world = tp * dp).
        rank, world: the global rank and world size.
        tp_rank, dp_rank: this rank's index inside its TP group and its DP group index.
        tp_group_name, dp_group_name: the c10d group names (what the functional collectives
            take; None in a single process). Names, not groups, so modules holding them copy and
            pickle.
        mesh: the 2-D `DeviceMesh` ("dp", "tp"), or None in a single process.
    """

    tp: int = 1
    dp: int = 1
    rank: int = 0
    world: int = 1
    tp_rank: int = 0
    dp_rank: int = 0
    tp_group_name: str | None = None
    dp_group_name: str | None = None
    mesh: Any = None

    def __deepcopy__(self, memo: dict) -> "ParallelGroups":
        return self                 # process-wide: a copied model stays on the same groups

    @property
    def single(self) -> bool:
        """No tensor parallelism: the model is whole in this process."""
        return self.tp == 1

    @property
    def tp_mesh(self) -> Any:
        """The 1-D TP sub-mesh (what `parallelize_module` takes), or None."""
        return None if self.mesh is None else self.mesh["tp"]

    @property
    def tp_group(self) -> Any:
        return None if self.mesh is None else self.mesh["tp"].get_group()

    @property
    def dp_group(self) -> Any:
        return None if self.mesh is None else self.mesh["dp"].get_group()

    @property
    def is_tp_leader(self) -> bool:
        """Rank 0 of its TP group: the one that writes a DP group's outputs."""
        return self.tp_rank == 0


SINGLE = ParallelGroups()
_CURRENT: list[ParallelGroups] = [SINGLE]


def check_tensor_size(tensor_parallel: object) -> int:
    """`tensor_parallel` as a positive int (bool excluded).

    Raises:
        ParallelError: anything else.
    """
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) or tensor_parallel < 1:
        raise ParallelError(f"tensor_parallel must be a positive integer, got {tensor_parallel!r}")
    return tensor_parallel


def check_tensor_parallel(tensor_parallel: object, world: int) -> int:
    """`tensor_parallel` as a positive int that divides `world` (the number of processes).

    Raises:
        ParallelError: not a positive int, or a size the world cannot be split into.
    """
    check_tensor_size(tensor_parallel)
    if world == 1 and tensor_parallel > 1:
        raise ParallelError(f"tensor_parallel={tensor_parallel} needs {tensor_parallel} processes, "
                            f"and this is a single process; launch with `torchrun "
                            f"--nproc_per_node {tensor_parallel} ...`")
    if world % tensor_parallel:
        raise ParallelError(f"tensor_parallel={tensor_parallel} does not divide the world size "
                            f"{world} (WORLD_SIZE); the world must be tensor_parallel x "
                            f"data-parallel groups")
    return tensor_parallel


def init_parallel(tensor_parallel: int = 1, device: str | torch.device | None = None,
                  timeout_s: float | None = None) -> ParallelGroups:
    """Join the process group `torchrun` describes and build the (dp, tp) mesh; idempotent.

    Args:
        tensor_parallel: ranks per TP group; `WORLD_SIZE` must be a multiple of it (the rest is
            data parallel). 1 in a single process is a no-op.
        device: the model's device (decides NCCL vs gloo and the mesh's device type).
        timeout_s: the process group's collective timeout (default: torch's).
    Returns:
        The groups, also kept as the current ones (`current_groups`).
    Raises:
        ParallelError: a size that does not fit the world, or a second call with another size.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
    tp = check_tensor_parallel(tensor_parallel, world)
    current = _CURRENT[0]
    if current.world == world and current.tp == tp and (world == 1 or current.mesh is not None):
        return current
    if world == 1:
        _CURRENT[0] = SINGLE
        return SINGLE
    if current.mesh is not None:
        raise ParallelError(f"tensor parallelism is already set up with tensor_parallel="
                            f"{current.tp}; one process serves one TP size")
    kind = torch.device(device).type if device is not None else "cpu"
    cuda = kind == "cuda" and torch.cuda.is_available()
    if cuda:       # NCCL binds each rank to the current device: set it before the group forms
        torch.cuda.set_device(torch.device(device).index if torch.device(device).index is not None
                              else int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        options = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
        dist.init_process_group(backend="nccl" if cuda else "gloo", **options)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda" if cuda else "cpu", (world // tp, tp),
                            mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    groups = ParallelGroups(tp=tp, dp=world // tp, rank=rank, world=world, tp_rank=rank % tp,
                            dp_rank=rank // tp, tp_group_name=mesh["tp"].get_group().group_name,
                            dp_group_name=mesh["dp"].get_group().group_name, mesh=mesh)
    _CURRENT[0] = groups
    return groups


def current_groups() -> ParallelGroups:
    """The groups `init_parallel` set up, or the single-process ones."""
    return _CURRENT[0]


def shutdown_parallel() -> None:
    """Barrier, then leave the process group (call once at the end of a distributed run)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    _CURRENT[0] = SINGLE
