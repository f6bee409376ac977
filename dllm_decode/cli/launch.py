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


DIST_TIMEOUT = [600.0]
"""Seconds a distributed rank waits for its peers (`--dist-timeout`): at the rendezvous and in
every collective, so a peer that never comes or dies is an error, not a hang."""
RENDEZVOUS_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK")
"""What `torch.distributed`'s env:// rendezvous reads besides WORLD_SIZE (torchrun sets them)."""


def _remember_timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not (value == value and 0 < value < float("inf")):
        raise click.BadParameter(f"{value!r} is not a finite number of seconds > 0", ctx=ctx, param=param)
    DIST_TIMEOUT[0] = value
    return value


def tensor_parallel_option(command: Any) -> Any:
    """`--tensor-parallel N` and `--dist-timeout SECONDS`."""
    command = click.option("--dist-timeout", type=float, default=DIST_TIMEOUT[0], show_default=True,
                           expose_value=False, callback=_remember_timeout, metavar="SECONDS",
                           help="Under torchrun: seconds a rank waits for its peers, at the rendezvous "
                                "and in every collective (then one line, exit 1).")(command)
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


def start(tensor_parallel: int, device: Any, command: str, data_parallel: bool = False,
          spec: Any = None) -> Any:
    """Check the world and join the (dp, tp) groups; returns `ParallelGroups` (the single-process
    ones when the world is 1). A CUDA device becomes this process's `cuda:LOCAL_RANK`. A model
    `spec` with no weights to shard (`ideal`, a causal LM) never joins a group; a launch without
    the rendezvous variables is a usage error; the rendezvous and every collective wait at most
    `--dist-timeout` seconds."""
    from dllm_decode.parallel import ParallelError, current_groups, init_parallel

    world = check_world(tensor_parallel, command, data_parallel)
    if world == 1:
        return current_groups()
    if spec is not None and getattr(spec, "kind", None) not in ("diffusion", "tiny"):
        raise click.BadParameter(f"--tensor-parallel shards a diffusion LM checkpoint; {str(spec)!r} has no "
                                 f"weights to shard (run it in one process)", param_hint="--model")
    missing = [key for key in RENDEZVOUS_KEYS if not os.environ.get(key)]
    if missing:
        raise click.UsageError(f"WORLD_SIZE={world} is set but not {', '.join(missing)}: launch with "
                               f"`torchrun --nproc_per_node {tensor_parallel} -m dllm_decode ...` (it sets "
                               f"them), or set {', '.join(RENDEZVOUS_KEYS)} on every rank")
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        return init_parallel(tensor_parallel, device, timeout_s=DIST_TIMEOUT[0])
    except ParallelError as err:
        raise click.UsageError(f"--tensor-parallel: {err}") from None
    except (RuntimeError, ValueError, OSError) as err:        # the rendezvous failed or timed out
        raise click.ClickException(f"cannot join the other ranks within --dist-timeout {DIST_TIMEOUT[0]:g} s "
                                   f"({_first(err)})") from None


def _first(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:200]


def agree(groups: Any, **inputs: Any) -> None:
    """Check, before any decoding, that every rank was launched with the same inputs (the model,
    the decode record, the prompt or requests): ranks that disagree would otherwise diverge and
    abort deep inside a collective. Compares one digest per rank.

    Raises:
        click.ClickException: naming the first rank whose inputs differ from rank 0's.
    """
    if groups.world <= 1:
        return
    import hashlib
    import json

    import torch.distributed as dist

    digest = {key: hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
              for key, value in inputs.items()}
    digests: list[Any] = [None] * groups.world
    try:
        dist.all_gather_object(digests, digest)
    except RuntimeError as err:
        raise click.ClickException(f"the ranks could not compare their inputs within --dist-timeout "
                                   f"{DIST_TIMEOUT[0]:g} s ({_first(err)})") from None
    differ = [rank for rank, other in enumerate(digests) if other != digests[0]]
    if differ:
        keys = sorted(k for k in inputs if digests[differ[0]].get(k) != digests[0].get(k))
        raise click.ClickException(f"rank {differ[0]} was launched with another {' and '.join(keys)} than "
                                   f"rank 0; every rank must get the same inputs")


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
