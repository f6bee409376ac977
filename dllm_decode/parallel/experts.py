"""Expert parallelism for the mixtures of experts (LLaDA2, DiffusionGemma): experts sharded across ranks.

Rank r of a group of n holds the routed experts [r·E/n, (r+1)·E/n) and nothing of the others. The
router (`mlp.gate`) and the shared experts stay replicated: the activations entering the MLP are
identical on every rank (they follow an all-reduce), the router runs in float32 on the same bytes,
so every rank chooses the same experts with the same weights and no routing message is needed
(tokens are not dispatched: every rank already holds every token). Each rank sums its own
experts' weighted outputs in float32 (either `moe_impl`: the eager loop or the static dense form),
one all-reduce (sum, float32) adds the ranks' partial sums, and the shared expert is added after
it, as on one process. With top-k = 2 every token's sum has at most two terms, so the result is
the one-process float32 sum exactly; for larger k it differs only by the order of additions.

This is the layout of DeepSeek-V3 / SGLang "EP under TP" without all-to-all: an all-to-all
dispatch pays only when the attention is data-parallel (each rank holding different tokens).

Explicit collectives, not DTensor: no DTensor placement expresses "these whole modules live on
this rank", and the partial sum must stay in float32 through the reduction.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch.distributed as dist
from torch import Tensor, nn

from dllm_decode.models.gemma_layers import GemmaExperts
from dllm_decode.models.llada2 import LLaDA2MoE


class ExpertShard(nn.Module):
    """The experts one rank holds, registered under their GLOBAL ids (`experts.5.gate_proj...`),
    so state-dict names stay the checkpoint's; indexed by LOCAL position 0..held-1."""

    def __init__(self, experts: dict[int, nn.Module]):
        super().__init__()
        self.ids = sorted(experts)
        for e in self.ids:
            self.add_module(str(e), experts[e])

    def __getitem__(self, i: int) -> nn.Module:
        return self._modules[str(self.ids[i])]

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[nn.Module]:
        return (self._modules[str(e)] for e in self.ids)


def expert_range(num_experts: int, rank: int, world: int) -> tuple[int, int]:
    """The global ids [lo, hi) rank `rank` of `world` holds.

    Raises:
        ValueError: `num_experts` is not divisible by `world`.
    """
    if num_experts % world:
        raise ValueError(f"expert parallelism over {world} ranks needs the number of experts "
                         f"({num_experts}) to be divisible by {world}; accepted sizes: "
                         f"{[n for n in range(1, num_experts + 1) if num_experts % n == 0]}")
    per = num_experts // world
    return rank * per, (rank + 1) * per


def all_reduce_float32(group: dist.ProcessGroup | None) -> Callable[[Tensor], Tensor]:
    """The partial-sum combiner: one in-place float32 all-reduce (sum) over `group`."""
    def combine(partial: Tensor) -> Tensor:
        dist.all_reduce(partial, op=dist.ReduceOp.SUM, group=group)
        return partial
    return combine


def shard_moe(moe: LLaDA2MoE, rank: int, world: int,
              combine: Callable[[Tensor], Tensor] | None) -> LLaDA2MoE:
    """Keep only rank `rank`'s experts in `moe` (the others are dropped, their memory freed) and
    combine partial sums with `combine`."""
    total = moe.gate.cfg.num_experts
    lo, hi = expert_range(total, rank, world)
    held_lo, held_hi = moe.expert_range
    if (held_lo, held_hi) != (0, total):
        raise ValueError(f"this MoE already holds only experts [{held_lo}, {held_hi}): shard a "
                         f"whole model")
    kept = {e: moe.experts[e] for e in range(lo, hi)}
    moe.experts = ExpertShard(kept)
    moe.expert_range = (lo, hi)
    moe.combine = combine
    moe._stacked = moe._stack() if moe.moe_impl == "static" else None
    return moe


def shard_experts(model: nn.Module, group: dist.ProcessGroup | None = None) -> nn.Module:
    """Expert-parallelise every `LLaDA2MoE` and `GemmaExperts` of `model` over `group` (default:
    the whole world); DiffusionGemma's router stays whole on every rank, as LLaDA2's.

    Run it on a model whose activations are replicated across the group (one process per rank
    under `torchrun`, the attention replicated or tensor-parallel over the same group).
    Returns `model`.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    combine = all_reduce_float32(group) if world > 1 else None
    for module in list(model.modules()):
        if isinstance(module, LLaDA2MoE):
            shard_moe(module, rank, world, combine)
        elif isinstance(module, GemmaExperts):
            module.hold(*expert_range(module.num_experts, rank, world), combine)
    return model
