#!/usr/bin/env python3
"""The one prepared GPU measurement of dllm-decode (`dllm_decode.eval.bench.device` says what it
runs): `python scripts/gpu_measure.py` from the repository root, with or without the package
installed; it needs torch, einops and safetensors only (no click, no transformers, no network).

    python scripts/gpu_measure.py --root "$OUT" --commit <sha> [--peer fast-dllm=PATH]
    python scripts/gpu_measure.py --quick          # every stage on the CPU, under a minute
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _importable() -> None:
    """Make `dllm_decode` and its root-level plugin folders (`eval`, `caches`, `schedulers`,
    `filters`) importable from this checkout when the package is not installed."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    importlib.import_module("dllm_decode._namespace").import_from_checkout()


def _preflight() -> None:
    """Exit with one line naming the missing packages (the device machine may lack them)."""
    import importlib.util

    missing = [name for name in ("torch", "einops", "safetensors") if importlib.util.find_spec(name) is None]
    if missing:
        sys.exit(f"gpu_measure.py: error: missing {', '.join(missing)}; install them, offline from a "
                 f"wheel folder: pip install --no-index --find-links .gpu-wheels {' '.join(missing)}")


if __name__ == "__main__":
    _preflight()
    _importable()
    from dllm_decode.eval.bench.device import main

    sys.exit(main())
