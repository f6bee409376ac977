"""`GraphCache`: one callable per bucket, made on first use, for each way of running the
captured step.

Modes:
  * `static`: the bucketed step run eagerly (the same buffers, padding and indices as a
    captured one; what the CPU tests compare with `generate`).
  * `compile`: `torch.compile(fullgraph=True, dynamic=False)` of the step, one compiled graph
    per bucket (`backend` "inductor" by default; "eager" traces without code generation, the
    fast check for graph breaks and recompiles).
  * `cuda-graphs`: the step recorded per bucket into a `torch.cuda.CUDAGraph` and replayed.
  * `regional`: one transformer block compiled per bucket (`torch.compile` of `block_step`,
    its layer's tensors as arguments, so the one compiled block serves every layer; inductor
    fuses its ops), the step around it run as written, and on CUDA the whole step recorded into
    a CUDA graph by hand: the replayed graph is fused kernels, not the eager op stream.

Why `torch.cuda.CUDAGraph` and not `torch.compile(mode="reduce-overhead")`: the step writes
its K/V store in place, and cudagraph trees skip a graph that mutates an input which is not a
parameter or buffer ("skipping cudagraphs due to mutated inputs"), re-record when a static
input's address changes, and keep their memory pool out of reach. Recording by hand makes the
static-buffer contract explicit (`StepBuffers` are the graph's inputs, their addresses fixed),
lets every bucket share one memory pool, and reports that pool's size. The recorded step holds
no random draw: sampling noise is drawn on the host side of the step with each request's own
generator, exactly as the eager loop draws it, so sampled runs repeat and match eager.

Each bucket's callable wraps its own copy of the step's code object, so torch.compile keeps one
cache entry per bucket: a decode that moves between buckets compiles each once and never
recompiles (`torch._dynamo.config.error_on_recompile` holds).
"""

from __future__ import annotations

import contextlib
import functools
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor

from dllm_decode.capture.buckets import Buckets
from dllm_decode.capture.step import block_step, captured_forward

CAPTURE_MODES = ("off", "static", "compile", "cuda-graphs", "regional")
"""How `Decoding` runs the model forward of a step: `off` (the cache's own eager forward),
`static` (the bucketed step, eagerly), `compile` (torch.compile of it), `cuda-graphs` (recorded
and replayed per bucket; CUDA only), `regional` (one compiled block reused for every layer,
recorded into a CUDA graph on CUDA)."""


class Entry(NamedTuple):
    """A bucket's callable and weak references to the objects it baked in."""

    owner: tuple
    call: Callable[..., Any]

    def owned_by(self, owner: tuple) -> bool:
        return len(owner) == len(self.owner) and all(ref() is o for ref, o in zip(self.owner, owner))


def _own_copy(fn: Callable) -> Callable:
    """`fn` with a code object of its own (torch.compile keys its graphs on the code object)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)


class GraphCache:
    """Per-bucket callables of the captured step, made lazily, in one of `CAPTURE_MODES`, and
    the buckets' static buffers they read (shared by every decode that uses this cache, one at
    a time: a recorded graph reads fixed addresses).

    Args:
        mode: "static", "compile", "cuda-graphs" or "regional".
        backend: torch.compile's backend for `compile` and `regional` (and, if given, for the
            graph recorded under `cuda-graphs`: None records the eager step).
        max_batch: the largest batch bucket (`Buckets.max_batch`).
        length_step: canvas widths are padded to a multiple of it (`Buckets.length_step`; a
            smaller step wastes fewer columns on short canvases and makes more buckets).
    Raises:
        ValueError: an unknown mode, or `cuda-graphs` without CUDA.
    """

    def __init__(self, mode: str = "compile", *, backend: str | None = None, max_batch: int = 64,
                 length_step: int = 64):
        if mode not in CAPTURE_MODES[1:]:
            raise ValueError(f"capture mode must be one of {list(CAPTURE_MODES)}, got {mode!r}")
        if mode == "cuda-graphs" and not torch.cuda.is_available():
            raise ValueError("cuda-graphs needs a CUDA device, and this torch build or machine "
                             "has none; use capture 'compile' or 'off' on the CPU")
        Buckets(max_batch=max_batch, length_step=length_step)      # checks both
        self.mode = mode
        self.backend = backend if backend is not None or mode != "compile" else "inductor"
        self.max_batch, self.length_step = max_batch, length_step
        self.entries: dict[tuple, Entry] = {}
        self.strict = False            # host syncs inside a captured call raise (CUDA; `checking`)
        self.buffers: dict[tuple, Any] = {}   # `StepBuffers` per bucket and K/V layout
        self.pool: Any = None
        self.pool_bytes = 0            # device memory the recorded graphs' pool holds
        self.captures = 0              # graphs compiled or recorded so far

    def __repr__(self) -> str:
        return f"GraphCache(mode={self.mode!r}, backend={self.backend!r}, buckets={len(self.entries)})"

    def run(self, key: tuple, owner: tuple, args: tuple[Any, ...],
            fn: Callable[..., Any] = captured_forward) -> Any:
        """`fn(*args)` for bucket `key` (`fn`: `captured_forward` or `captured_step`; its
        tensors the bucket's static buffers). `owner`: the objects a recorded graph baked in (the
        compact stack, the rotary tables); the entry holds weak references to them, so another
        owner, or a new one at a freed one's address, records the bucket afresh."""
        entry = self.entries.get(key)
        if entry is None or not entry.owned_by(owner):
            entry = Entry(tuple(weakref.ref(o) for o in owner), self._make(args, fn))
            self.entries[key] = entry
            self.captures += 1
        return entry.call(*args)

    @contextlib.contextmanager
    def checking(self) -> Iterator[None]:
        """Around a whole captured call (buffer loads, index writes, the run, the output
        slices): with `strict` set on CUDA, any host sync in it raises
        (`torch.cuda.set_sync_debug_mode("error")`)."""
        if not (self.strict and torch.cuda.is_available()):
            yield
            return
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")

    def _make(self, args: tuple[Any, ...], fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        if self.mode == "static":
            return fn
        if self.mode == "regional":
            block = torch.compile(_own_copy(block_step), fullgraph=True, dynamic=False,
                                  backend=self.backend or "inductor")
            step = functools.partial(fn, block_fn=block)
            on_cuda = any(isinstance(a, Tensor) and a.is_cuda for a in args)
            return self._record(step, args) if on_cuda else step
        fn = _own_copy(fn)
        if self.mode == "compile":
            return torch.compile(fn, fullgraph=True, dynamic=False, backend=self.backend)
        if self.backend is not None:
            fn = torch.compile(fn, fullgraph=True, dynamic=False, backend=self.backend)
        return self._record(fn, args)

    def _record(self, fn: Callable[..., Tensor], args: tuple[Any, ...]) -> Callable[..., Tensor]:
        """Record `fn(*args)` into a CUDA graph sharing this cache's pool; returns its replay
        (which the caller runs next: recording runs nothing). The warm-up runs write the canvas
        (a fused step commits tokens) and the K/V store, so every tensor argument is restored
        after them."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            warm_up(fn, args)                     # kernels chosen, workspaces allocated
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # the warm-up's freed blocks go back first, so the growth read below is the pool's own
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = fn(*args)
        self.pool_bytes += max(torch.cuda.memory_reserved() - before, 0)

        def replay(*_: Any) -> Tensor:
            graph.replay()
            return output

        return replay


def warm_up(fn: Callable[..., Tensor], args: tuple[Any, ...], runs: int = 2) -> None:
    """Run `fn(*args)` `runs` times and put every tensor argument back as it was (the runs
    write the canvas and the K/V store)."""
    saved = [(a, a.clone()) for a in args if isinstance(a, Tensor)]
    for _ in range(runs):
        fn(*args)
    for tensor, copy in saved:
        tensor.copy_(copy)
