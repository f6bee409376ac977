"""Data-parallel evaluation with `torch.distributed` (launched by `torchrun`).

Each rank decodes its share of the batches and appends to its own `samples.rank<r>.jsonl`; after a
barrier, rank 0 merges the shards into `samples.jsonl` (skipping keys it already holds, so a merge
interrupted half-way is simply redone) and removes them. Without an initialised process group
everything runs as rank 0 of 1.
"""

from __future__ import annotations

import os
from pathlib import Path

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
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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
