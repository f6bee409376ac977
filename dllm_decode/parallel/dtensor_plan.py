"""The same tensor-parallel plan expressed with DTensor's `parallelize_module`, for the reference
runtime: the description the explicit layout (`plan.shard_model`) is checked against, and the
route for users who want DTensor parameters (distributed checkpoints, their own plans).

`ColwiseParallel` on q, k, v, gate and up; `RowwiseParallel` on o and down; `RowwiseParallel`
(replicated input and output) on the embedding, which DTensor turns into a vocab-parallel lookup;
`ColwiseParallel` with a replicated output on the head (the hidden states reaching it are the
window's rows only, so the gather is the window's logits). Block head counts become local.

Where it does not run, and why the package's own TP uses explicit collectives
(`dllm_decode.parallel.plan`): the compact runtime fuses q|k|v and gate|up from the module
weights with `torch.cat`, and a DTensor weight there raises "mixed torch.Tensor and DTensor", so
a model parallelized here must run `runtime="reference"`; a tied head would need one DTensor in
two placements; and KV-head replication (tp > Hkv) has no DTensor placement. Each is refused with
a `ParallelError`.
"""

from __future__ import annotations

from torch import nn

from dllm_decode.parallel.groups import ParallelError, ParallelGroups
from dllm_decode.parallel.plan import ROLES, STYLES, check_divisible, head_of


def parallelize_with_dtensor(model: nn.Module, groups: ParallelGroups) -> nn.Module:
    """Shard a whole `BlockStackLM` in place with `parallelize_module` over the TP mesh.

    Raises:
        ParallelError: a tied head, KV heads fewer than tp, or sizes that do not divide.
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from dllm_decode.models.compact import set_runtime
    from dllm_decode.models.layers import TiedHead

    if groups.single:
        return model
    tp = groups.tp
    names = {id(m): n for n, m in model.named_modules()}
    embed, blocks = model.parts()
    head_path, head = head_of(model)
    if isinstance(head, TiedHead):
        raise ParallelError("the DTensor plan does not cover tied embeddings; use "
                            "dllm_decode.parallel.shard_model")
    plan: dict[str, object] = {
        names[id(embed)]: RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        head_path: ColwiseParallel(output_layouts=Replicate()),
    }
    for block in blocks:
        parts = dict(zip(ROLES, block.parts()))
        check_divisible(block.n_heads, block.n_kv_heads, parts["gate"].weight.shape[0], tp)
        if block.n_kv_heads % tp:
            raise ParallelError(f"the DTensor plan cannot replicate {block.n_kv_heads} KV heads "
                                f"over {tp} ranks; use dllm_decode.parallel.shard_model")
        for role in ("q", "k", "v", "gate", "up", "o", "down"):
            style = RowwiseParallel() if STYLES[role].startswith("row") else ColwiseParallel()
            plan[names[id(parts[role])]] = style
        block.n_heads //= tp
        block.n_kv_heads //= tp
    set_runtime(model, "reference")
    parallelize_module(model, groups.tp_mesh, plan)
    return model
