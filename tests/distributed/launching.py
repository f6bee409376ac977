"""Launching the command line under `torchrun`, and rank functions under `mp.spawn`, from tests.

Both retry ONCE when the launch failed although every rank's output is complete: on a loaded
machine a gloo rank sometimes aborts at exit ("terminate called without an active exception",
exit -6) after its work is done (see `harness.py`). A retried launch still has to pass; any
other failure shows the stderr tail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(args: list[str], nproc: int, cwd: Path, done: Callable[[], bool],
             timeout: float = 600) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node nproc -m dllm_decode *args`; `done()` says whether the outputs
    are complete (then a failed exit is retried once)."""
    for attempt in range(2):
        run = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
             "--master_port", str(free_port()), "-m", "dllm_decode", *args],
            capture_output=True, text=True, cwd=cwd, timeout=timeout,
            env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        if run.returncode == 0 or attempt == 1 or not done():
            return run
    return run


def spawn(function: Callable[..., None], args: tuple, nprocs: int, out: Path) -> None:
    """`torch.multiprocessing.spawn(function, (*args,), nprocs)` whose ranks each write
    `out/rank<r>.json`."""
    for attempt in range(2):
        for old in out.glob("rank*.json"):
            old.unlink()
        try:
            torch.multiprocessing.spawn(function, args=args, nprocs=nprocs, join=True)
            return
        except torch.multiprocessing.ProcessExitedException as err:
            complete = all((out / f"rank{r}.json").is_file() for r in range(nprocs))
            if attempt == 1 or not complete:
                pytest.fail(f"a rank exited abnormally: {err}")
