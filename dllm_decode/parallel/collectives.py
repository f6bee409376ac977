"""The collectives tensor parallelism issues, and a counter of them.

Every collective here is a functional one (`torch.ops._c10d_functional.*` followed by
`wait_tensor`): it returns a new tensor, traces under `torch.compile(fullgraph=True)` and is
captured by CUDA graphs on NCCL. DTensor's redistributions dispatch the same ops, so one counter
sees both.

`CollectiveCounter` is a `TorchDispatchMode`: it records each collective op that reaches the
dispatcher, with the bytes of the tensor this rank contributes (the payload: an all_reduce's
input, an all_gather's local shard, a broadcast's tensor). The bytes a rank actually puts on the
wire depend on the algorithm (a ring all_reduce sends 2 (n - 1) / n of the payload); the payload
is what the scaling model starts from. Counts are exact, whatever the backend.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

_FUNCTIONAL = torch.ops._c10d_functional


def all_reduce(x: Tensor, group_name: str | None) -> Tensor:
    """Sum of `x` over the group (a new tensor); `x` itself when there is no group."""
    if group_name is None:
        return x
    return _FUNCTIONAL.wait_tensor(_FUNCTIONAL.all_reduce(x.contiguous(), "sum", group_name))


def all_reduce_max(x: Tensor, group_name: str | None) -> Tensor:
    """Elementwise max of `x` over the group (a new tensor); `x` itself when there is no group."""
    if group_name is None:
        return x
    return _FUNCTIONAL.wait_tensor(_FUNCTIONAL.all_reduce(x.contiguous(), "max", group_name))


def all_gather_last(x: Tensor, size: int, group_name: str | None) -> Tensor:
    """The group's shards of `x` (..., n) concatenated along the last dim, rank order:
    (..., size * n). One all_gather of the shards."""
    if group_name is None:
        return x
    gathered = _FUNCTIONAL.wait_tensor(
        _FUNCTIONAL.all_gather_into_tensor(x.contiguous(), size, group_name))   # (size * d0, ...)
    parts = gathered.view(size, *x.shape)
    return torch.movedim(parts, 0, -2).reshape(*x.shape[:-1], size * x.shape[-1])


def broadcast(x: Tensor, src: int, group_name: str | None) -> Tensor:
    """`x` of global rank `src`, on every rank of the group."""
    if group_name is None:
        return x
    return _FUNCTIONAL.wait_tensor(_FUNCTIONAL.broadcast(x.contiguous(), src, group_name))


COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d")
"""Operator namespaces whose ops are collectives (functional, and the in-place c10d ops that
`torch.distributed.all_reduce` and friends dispatch)."""

NOT_COLLECTIVES = {"wait_tensor", "wait", "barrier", "monitored_barrier", "_wrap_tensor_autograd"}
"""Ops in those namespaces that move no data (the counter skips them)."""


class CollectiveCounter(TorchDispatchMode):
    """Count the collectives dispatched while active, per op name, with the payload bytes.

    Use as a context manager around one decode step (or a whole decode) on every rank:

        with CollectiveCounter() as counter:
            logits = model(ids, rows=rows)
        counter.counts   # Counter({"all_reduce": 2 * layers + 1, "all_gather_into_tensor": 1})
        counter.bytes    # Counter of payload bytes per op name

    `events` keeps (op name, shape, dtype, bytes) in order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.bytes: Counter = Counter()
        self.events: list[tuple[str, tuple[int, ...], torch.dtype, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name
        namespace, _, op = name.partition("::")
        if namespace in COLLECTIVE_NAMESPACES and op.rstrip("_") not in NOT_COLLECTIVES:
            op = op.rstrip("_")
            tensor = _first_tensor(args)
            size = 0 if tensor is None else tensor.numel() * tensor.element_size()
            self.counts[op] += 1
            self.bytes[op] += size
            self.events.append((op, tuple(tensor.shape) if tensor is not None else (),
                                tensor.dtype if tensor is not None else torch.float32, size))
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        """Number of collectives counted."""
        return sum(self.counts.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def _first_tensor(args: Any) -> Tensor | None:
    for arg in args:
        if isinstance(arg, Tensor):
            return arg
        if isinstance(arg, (list, tuple)):
            found = _first_tensor(arg)
            if found is not None:
                return found
    return None
