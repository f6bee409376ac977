"""Data-parallel evaluation with `torch.distributed` (launched by `torchrun`), and TP x DP.

Each rank decodes its share of the batches and appends to its own `samples.rank<r>.jsonl`; after a
barrier, rank 0 merges the shards into `samples.jsonl` (skipping keys it already holds, so a merge
interrupted half-way is simply redone) and removes them. Without an initialised process group
everything runs as rank 0 of 1.

With tensor parallelism (`eval --tensor-parallel T` on a world of T x D ranks,
`dllm_decode.parallel.init_parallel`) the data-parallel workers are the D TP groups, not the
ranks: `rank_and_world` is (the DP group's index, D), so the batches are sharded by DP group;
every rank of a group decodes the group's batches together (the model's collectives pair up),
and only the group's TP rank 0 (`writes`) reads what is done, tells its group
(`from_group_leader`) and writes `samples.rank<dp>.jsonl`. The merge is unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dllm_decode.eval.harness.records import append_records, read_records, repair


def init_from_env(device: str | None = None) -> tuple[int, int]:
    """Join the process group `torchrun` describes (WORLD_SIZE > 1), once. Returns (rank, world).

    The backend is NCCL for CUDA devices and gloo otherwise.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and dist.is_available() and not dist.is_initialized():
        cuda = (device or "").startswith("cuda") and torch.cuda.is_available()
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return rank_and_world()


def rank_and_world() -> tuple[int, int]:
    """This process's data-parallel place: (rank, world), or (DP group, DP groups) under TP."""
    groups = _tensor_parallel()
    if groups is not None:
        return groups.dp_rank, groups.dp
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def writes() -> bool:
    """Whether this process writes its DP worker's samples (not a TP follower)."""
    groups = _tensor_parallel()
    return groups is None or groups.tp_rank == 0


def from_group_leader(value: Any) -> Any:
    """`value` of this TP group's rank 0 (JSON-able), on every rank of the group; `value` itself
    without tensor parallelism. Every rank of the world calls it at the same point."""
    groups = _tensor_parallel()
    if groups is None:
        return value
    if not _CHANNEL:
        from dllm_decode.parallel.control import ControlChannel

        _CHANNEL.append(ControlChannel(groups))
    channel = _CHANNEL[0]
    if channel.leads:
        channel.publish(value)
        return value
    return channel.receive()


_CHANNEL: list[Any] = []


def _tensor_parallel() -> Any:
    """The TP groups when this process runs tensor parallel, else None."""
    from dllm_decode.parallel import current_groups

    groups = current_groups()
    return groups if groups.tp > 1 else None


def local_device(device: str | None) -> str | None:
    """`cuda` becomes `cuda:<LOCAL_RANK>` under torchrun, so ranks do not share one GPU."""
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{os.environ['LOCAL_RANK']}"
    return device


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def merge_shards(out_dir: Path, name: str) -> int:
    """Append every shard record (`samples.rank*.jsonl`, from any earlier world size too) missing
    from `out_dir/name`, then delete the shards.

    Returns the number of records appended.
    """
    target = out_dir / name
    repair(target)
    have = {r["key"] for r in read_records(target)}
    added = 0
    shards = sorted(out_dir.glob("samples.rank*.jsonl"))
    for shard in shards:
        fresh = [r for r in read_records(shard) if r["key"] not in have]
        have.update(r["key"] for r in fresh)
        append_records(target, fresh)
        added += len(fresh)
    for shard in shards:
        shard.unlink(missing_ok=True)
    return added
