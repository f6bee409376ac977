"""Keep freed activation memory in the process instead of handing it back to the OS.

glibc serves allocations above its mmap threshold (128 KiB to 32 MiB, adapting) with fresh
`mmap` pages and unmaps them on free, and trims the heap top above its trim threshold. A
diffusion forward allocates the same large activation buffers every step, so each step
page-faults them back in: on a small model at a large batch those faults can take most of the
kernel time (the slow test in `tests/test_allocator.py` counts them). Raising both
thresholds makes the allocator reuse those blocks.

Safe for a decoding process: its resident memory stays at its peak instead of shrinking between
forwards, which is what a process that will run the next forward wants. The command line and the
server apply it at start-up; a program that embeds the library decides for itself (call
`keep_freed_memory()` once). Torch's CPU allocator has no cache of its own, so this is the layer
where reuse happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3      # glibc mallopt parameters (malloc.h)
THRESHOLD = 1 << 30                              # allocations below 1 GiB come from the heap
OPT_OUT = "DLLM_DECODE_KEEP_FREED_MEMORY"

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (once per process). Returns True when applied;
    False on a C library without `mallopt` (musl, macOS, Windows) or when the environment
    variable `DLLM_DECODE_KEEP_FREED_MEMORY=0` opts out."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(OPT_OUT, "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        mallopt = None
    if mallopt is None:
        return False
    _applied = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD))
    return _applied
