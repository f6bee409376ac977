"""Launch a rank script under `torchrun` (gloo, CPU) from pytest and collect each rank's results.

Each rank writes `result.rank<r>.json` (atomically) into the output folder; the test reads every
rank's file. Known flake on a loaded machine: a rank sometimes aborts AT EXIT ("terminate called
without an active exception", exit -6) after writing correct results, a teardown race in the
gloo / c10d threads. A launch that fails with every result file complete is therefore retried
once (never counted as a pass); any other failure prints the stderr tail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_ranks(module: str, nproc: int, out: Path, *args: str, timeout: float = 300) -> list[dict]:
    """Run `python -m module out *args` on `nproc` ranks; returns the ranks' results in rank order."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(nproc), "-m", module, str(out), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    for attempt in range(2):
        for old in out.glob("result.rank*.json"):
            old.unlink()
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
        files = [out / f"result.rank{r}.json" for r in range(nproc)]
        complete = all(f.is_file() for f in files)
        if proc.returncode == 0 and complete:
            return [json.loads(f.read_text()) for f in files]
        if not complete or attempt == 1:
            break
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    pytest.fail(f"{module} on {nproc} ranks exited {proc.returncode} "
                f"({sum(f.is_file() for f in files)}/{nproc} result files):\n{tail}")
