"""The control channel of a tensor-parallel group: rank 0 tells the others what to do, as JSON.

Under tensor parallelism every rank of a TP group must run the same engine steps on the same
requests (the model's collectives pair up step by step). Only TP rank 0 hears the outside world
(HTTP, the requests file), so it publishes each batch of engine commands (requests admitted,
cancellations, stop) and the other ranks apply them in the same order.

A message is one int64 length, then the UTF-8 JSON bytes as a uint8 tensor, broadcast over a gloo
group of the TP ranks (CPU tensors, also when the model's collectives run on NCCL). JSON, never
pickle: nothing received is unpickled (`broadcast_object_list` would unpickle).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dllm_decode.parallel.groups import ParallelGroups

IDLE_TIMEOUT = timedelta(days=7)
"""How long a follower may wait for the next message (a server may be idle for long)."""


class ControlChannel:
    """Rank 0 of a TP group `publish`es JSON values; the group's other ranks `receive` them.

    Create it on every rank of the world at the same point (it makes a process group).
    """

    def __init__(self, groups: ParallelGroups):
        self.groups = groups
        self.leader = groups.dp_rank * groups.tp           # the TP group's rank 0 (global rank)
        self.group: Any = None
        if groups.world > 1:
            members = [[d * groups.tp + t for t in range(groups.tp)] for d in range(groups.dp)]
            for ranks in members:           # every rank creates every group, in the same order
                group = dist.new_group(ranks, backend="gloo", timeout=IDLE_TIMEOUT)
                if groups.rank in ranks:
                    self.group = group

    @property
    def leads(self) -> bool:
        """Whether this rank publishes (TP rank 0)."""
        return self.groups.tp_rank == 0

    def publish(self, value: Any) -> None:
        """Send `value` (JSON-able) to the group's other ranks (TP rank 0 only)."""
        if self.group is None or self.groups.tp == 1:
            return
        data = torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        dist.broadcast(size, self.leader, group=self.group)
        dist.broadcast(data, self.leader, group=self.group)

    def receive(self) -> Any:
        """The next value TP rank 0 published (blocks until it comes)."""
        size = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(size, self.leader, group=self.group)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(data, self.leader, group=self.group)
        return json.loads(bytes(data.tolist()).decode())
