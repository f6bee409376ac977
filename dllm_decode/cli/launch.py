"""`--tensor-parallel N` on decode, batch, serve and eval: joining the group `torchrun` started.

    torchrun --nproc_per_node 2 -m dllm_decode --tensor-parallel 2 --model DIR --prompt "..."
    torchrun --nproc_per_node 2 -m dllm_decode --tensor-parallel 2 --model DIR --input a.jsonl --output b.jsonl
    torchrun --nproc_per_node 2 -m dllm_decode serve --tensor-parallel 2 --model DIR
    torchrun --nproc_per_node 4 -m dllm_decode eval --tensor-parallel 2 --model DIR --out runs/x

Every rank runs the same command. decode, batch and serve run ONE tensor-parallel group: the
world size must equal N. Every rank decodes; TP rank 0 alone prints, writes the output file
(under its writer lock) or owns HTTP; the other ranks follow it. `eval` accepts a world of N x D
ranks: D data-parallel groups of N ranks each (`eval/harness/distributed.py`).

A size that does not fit is a usage error naming the world size, before any model loads.
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any, Iterator

import click

TENSOR_PARALLEL_HELP = ("Shard the model over N processes (tensor parallel; launch N processes per "
                        "group with `torchrun --nproc_per_node N -m dllm_decode ...`). [1]")


def tensor_parallel_option(command: Any) -> Any:
    """`--tensor-parallel N`."""
    return click.option("--tensor-parallel", "tensor_parallel", type=click.IntRange(1), default=1,
                        metavar="N", help=TENSOR_PARALLEL_HELP)(command)


def world_size() -> int:
    """The launcher's world size (`WORLD_SIZE`, 1 without a launcher)."""
    text = os.environ.get("WORLD_SIZE", "1")
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise click.UsageError(f"WORLD_SIZE={text!r} is not a positive integer (set by torchrun)")
    return int(text)


def check_world(tensor_parallel: int, command: str, data_parallel: bool = False) -> int:
    """The world size, checked against `--tensor-parallel` before any model loads.

    Raises:
        click.UsageError: N > 1 without a launcher, a world N does not divide, or (for the
            commands that run one group: decode, batch, serve) a world other than N.
    """
    from dllm_decode.parallel import ParallelError, check_tensor_parallel

    world = world_size()
    try:
        check_tensor_parallel(tensor_parallel, world)
    except ParallelError as err:
        raise click.UsageError(f"--tensor-parallel: {err}") from None
    if not data_parallel and world != tensor_parallel:
        raise click.UsageError(f"`{command}` runs one tensor-parallel group: --tensor-parallel "
                               f"({tensor_parallel}) must equal the world size {world} "
                               f"(torchrun --nproc_per_node {tensor_parallel}); data-parallel "
                               f"groups are for `eval`")
    return world


def start(tensor_parallel: int, device: Any, command: str, data_parallel: bool = False) -> Any:
    """Check the world and join the (dp, tp) groups; returns `ParallelGroups` (the single-process
    ones when the world is 1). A CUDA device becomes this process's `cuda:LOCAL_RANK`."""
    from dllm_decode.parallel import ParallelError, current_groups, init_parallel

    world = check_world(tensor_parallel, command, data_parallel)
    if world == 1:
        return current_groups()
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        return init_parallel(tensor_parallel, device)
    except ParallelError as err:
        raise click.UsageError(f"--tensor-parallel: {err}") from None


def finish(groups: Any) -> None:
    """Leave the process group (every rank, at the end of a distributed command)."""
    from dllm_decode.parallel import shutdown_parallel

    if groups.world > 1:
        shutdown_parallel()


@contextlib.contextmanager
def leader_speaks(groups: Any) -> Iterator[None]:
    """Inside, a rank other than TP rank 0 prints nothing (it runs the same work silently)."""
    if groups.tp_rank == 0:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield
