"""The tensor-parallel plan of the dense families, as one table, and the sharding it drives.

Every dense family here (LLaDA, Dream, Fast-dLLM v2, SDAR, the embedded models) is a
`BlockStackLM` of Llama-style `PreNormBlock`s, whose `parts()` name the same nine roles in every
family, so one table covers them all (no per-family plan):

| role | style | local weight | collective |
|---|---|---|---|
| q | column, heads split by rank | (H/tp D, d) | none |
| k, v | column, KV heads split (or replicated when tp % Hkv == 0) | (Hkv/tp D, d) | none |
| o | row (`RowParallelLinear`) | (d, H/tp D) | all_reduce |
| gate, up | column | (F/tp, d) | none |
| down | row (`RowParallelLinear`) | (d, F/tp) | all_reduce |
| norms, q/k norms | replicated | full | none |
| embedding | vocabulary rows (`VocabParallelEmbedding`) | (Vp/tp, d) | all_reduce |
| head | vocabulary rows (`VocabParallelHead`) | (Vp/tp, d) | all_gather of the window's logits |

Vp is the vocabulary padded with zero rows to a multiple of tp (the embedded models' V = 129);
the padding columns are cut after the gather, so no softmax ever sees them. Column biases are
split with their rows; a row layer's bias is held by TP rank 0 (zeros elsewhere) and so is added
once by the all_reduce. Per decode step this is 2 all_reduces per layer, one for the embedding,
and one all_gather of the window's logits.

Why explicit collectives and not DTensor's `parallelize_module`: both runtimes run the same
sharded modules. The compact runtime (the default) fuses q|k|v and gate|up from the module
weights with `torch.cat`; a DTensor weight there raises "mixed torch.Tensor and DTensor", while
plain local shards fuse into the per-rank [q_r | k_r | v_r] matrix with no change. The reference
runtime calls the same modules (the row layers reduce in their `forward`). Tied heads share the
embedding's slice, and KV heads fewer than tp are replicated, neither of which has a DTensor
placement. The same layout written with DTensor (`parallel.dtensor_plan`, reference runtime)
gives bit-identical logits and the same collectives in the tests; it stays the cross-check and
the interoperability route, not the path `load_model` takes, because it cannot serve the compact
runtime, tied heads or replicated KV heads.

Sizes that do not divide raise `ParallelError` naming the count and the legal sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from dllm_decode.parallel.groups import ParallelError, ParallelGroups
from dllm_decode.parallel.layers import RowParallelLinear, VocabParallelEmbedding, VocabParallelHead

ROLES = ("attn_norm", "q", "k", "v", "o", "ff_norm", "gate", "up", "down")
"""`PreNormBlock.parts()` in order."""

STYLES = {"attn_norm": "replicate", "q": "heads", "k": "kv_heads", "v": "kv_heads",
          "o": "row_heads", "ff_norm": "replicate", "gate": "ff", "up": "ff", "down": "row_ff"}
"""The plan: each role's style (the table above)."""

HEAD_PATHS = ("lm_head", "model.transformer.ff_out")
"""Where the families keep their head module (transformers layout, LLaDA layout)."""


@dataclass(frozen=True)
class Slice:
    """Which part of a checkpoint tensor a rank holds.

    `dim` None: the whole tensor (replicated), or zeros on every rank but TP rank 0 when
    `leader_only` (a row layer's bias). Otherwise [start, stop) along `dim`, zero-padded to
    `local` (the vocabulary padding).
    """

    dim: int | None = None
    start: int = 0
    stop: int = 0
    local: int = 0
    leader_only: bool = False

    def local_shape(self, full: tuple[int, ...]) -> tuple[int, ...]:
        if self.dim is None:
            return tuple(full)
        shape = list(full)
        shape[self.dim] = self.local
        return tuple(shape)


REPLICATED = Slice()


def legal_sizes(heads: int, kv_heads: int, ff: int, limit: int = 64) -> list[int]:
    """The tensor-parallel sizes (up to `limit`) a block of these counts can be split into."""
    return [tp for tp in range(1, limit + 1)
            if heads % tp == 0 and ff % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)]


def check_divisible(heads: int, kv_heads: int, ff: int, tp: int) -> None:
    """Raise `ParallelError` unless H % tp == 0, F % tp == 0 and (Hkv % tp == 0 or tp % Hkv == 0)."""
    problems = []
    if heads % tp:
        problems.append(f"{heads} attention heads")
    if kv_heads % tp and tp % kv_heads:
        problems.append(f"{kv_heads} key/value heads (neither divides the other)")
    if ff % tp:
        problems.append(f"MLP width {ff}")
    if problems:
        raise ParallelError(f"tensor_parallel={tp} cannot split {' and '.join(problems)}; legal "
                            f"sizes for this model: {legal_sizes(heads, kv_heads, ff)}")


def _span(count: int, tp: int, rank: int, width: int) -> tuple[int, int]:
    per = count // tp
    return rank * per * width, (rank + 1) * per * width


def block_slices(block: Any, groups: ParallelGroups) -> dict[str, tuple[Slice, Slice]]:
    """Role -> (weight slice, bias slice) for one `PreNormBlock` on this rank."""
    tp, rank = groups.tp, groups.tp_rank
    q = block.parts()[1]
    heads, kv_heads = block.n_heads, block.n_kv_heads
    head_dim = q.weight.shape[0] // heads
    ff = block.parts()[6].weight.shape[0]
    check_divisible(heads, kv_heads, ff, tp)
    q_rows = _span(heads, tp, rank, head_dim)
    if kv_heads % tp == 0:
        kv_rows = _span(kv_heads, tp, rank, head_dim)
    else:                                   # tp % Hkv == 0: each KV head on tp / Hkv ranks
        index = rank // (tp // kv_heads)
        kv_rows = (index * head_dim, (index + 1) * head_dim)
    ff_rows = _span(ff, tp, rank, 1)

    def column(span: tuple[int, int]) -> tuple[Slice, Slice]:
        s = Slice(0, span[0], span[1], span[1] - span[0])
        return s, s

    def row(span: tuple[int, int]) -> tuple[Slice, Slice]:
        return Slice(1, span[0], span[1], span[1] - span[0]), Slice(leader_only=True)

    by_style: dict[str, tuple[Slice, Slice]] = {
        "replicate": (REPLICATED, REPLICATED), "heads": column(q_rows),
        "kv_heads": column(kv_rows), "row_heads": row(q_rows), "ff": column(ff_rows),
        "row_ff": row(ff_rows)}
    return {role: by_style[STYLES[role]] for role in ROLES}


def vocab_slice(vocab: int, groups: ParallelGroups) -> Slice:
    """This rank's rows of a vocabulary of `vocab` padded to a multiple of tp."""
    per = -(-vocab // groups.tp)
    start = groups.tp_rank * per
    return Slice(0, min(start, vocab), min(start + per, vocab), per)


def head_of(model: nn.Module) -> tuple[str, nn.Module]:
    """The head module and its path."""
    for path in HEAD_PATHS:
        try:
            return path, model.get_submodule(path)
        except AttributeError:
            continue
    raise ParallelError(f"{type(model).__name__} has no head module at {list(HEAD_PATHS)}; "
                        f"tensor parallelism covers LLaDA, Dream, Fast-dLLM v2, SDAR and the "
                        f"embedded models")


Reader = Callable[[str, Slice, tuple[int, ...]], Tensor]
"""(state-dict name, slice, full shape) -> this rank's tensor of the slice's local shape."""

FAMILY_PLANS: dict[type, Callable[..., nn.Module]] = {}
"""Model class -> its own sharding (`shard_model`'s signature), for families outside the table
above (LLaDA2's mixture of experts: `parallel.llada2`, registered when `dllm_decode.parallel`
is imported)."""


def shard_model(model: nn.Module, groups: ParallelGroups, read: Reader | None = None,
                dtype: torch.dtype | None = None) -> nn.Module:
    """Shard `model` in place over `groups`' TP group; returns it.

    Args:
        model: a `BlockStackLM` of `PreNormBlock`s, whole or built on the meta device.
        read: where each rank's slices come from (`parallel.loading.checkpoint_reader` reads
            them from safetensors files); default: the model's own whole weights.
        dtype: the dtype of the filled parameters (default: each source tensor's).
    Raises:
        ParallelError: a model this plan does not cover, or a size that does not divide.
    """
    from dllm_decode.models.layers import BlockStackLM, PreNormBlock, TiedHead

    if groups.single:
        return model
    for family, plan in FAMILY_PLANS.items():          # families with a plan of their own
        if isinstance(model, family):
            return plan(model, groups, read, dtype)
    if not isinstance(model, BlockStackLM) or not all(
            isinstance(b, PreNormBlock) for b in model.parts()[1]):
        raise ParallelError(f"tensor parallelism covers the dense Llama-style families (LLaDA, "
                            f"Dream, Fast-dLLM v2, SDAR, the embedded models), not "
                            f"{type(model).__name__}")
    if read is None:
        whole = {k: v.detach() for k, v in model.state_dict().items()}
        read = _from_tensors(whole, groups.tp_rank)
    full_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    parents = {id(child): (parent, name) for parent in model.modules()
               for name, child in parent.named_children()}
    names = {id(m): n for n, m in model.named_modules()}
    slices: dict[str, Slice] = {}
    tp, group = groups.tp, groups.tp_group_name

    def replace(old: nn.Module, new: nn.Module, weight: Slice, bias: Slice) -> None:
        parent, attr = parents[id(old)]
        setattr(parent, attr, new)
        prefix = names[id(old)]
        slices[f"{prefix}.weight"] = weight
        if getattr(old, "bias", None) is not None:
            slices[f"{prefix}.bias"] = bias

    embed, blocks = model.parts()
    for block in blocks:
        plan = block_slices(block, groups)
        parts = dict(zip(ROLES, block.parts()))
        for role in ("q", "k", "v", "gate", "up", "o", "down"):
            old = parts[role]
            weight, bias = plan[role]
            shape = weight.local_shape(tuple(old.weight.shape))
            has_bias = old.bias is not None
            if STYLES[role].startswith("row"):
                new = RowParallelLinear(shape[1], shape[0], has_bias, group, device="meta")
            else:
                new = nn.Linear(shape[1], shape[0], bias=has_bias, device="meta")
            replace(old, new, weight, bias)
        heads, kv_heads = block.n_heads, block.n_kv_heads
        block.n_heads = heads // tp
        block.n_kv_heads = kv_heads // tp if kv_heads % tp == 0 else 1
    vocab = vocab_slice(embed.weight.shape[0], groups)
    new_embed = VocabParallelEmbedding(vocab.local, embed.weight.shape[1], vocab.start, group,
                                       device="meta")
    head_path, head = head_of(model)
    replace(embed, new_embed, vocab, REPLICATED)
    tied = isinstance(head, TiedHead)
    head_vocab = vocab_slice(embed.weight.shape[0] if tied else head.weight.shape[0], groups)
    new_head = VocabParallelHead(head_vocab.local, embed.weight.shape[1],
                                 embed.weight.shape[0] if tied else head.weight.shape[0], tp,
                                 group, bias=getattr(head, "bias", None) is not None,
                                 tied=new_embed if tied else None, device="meta")
    if tied:
        parent, attr = parents[id(head)]
        setattr(parent, attr, new_head)
    else:
        replace(head, new_head, head_vocab, head_vocab)
    _fill(model, slices, full_shapes, read, dtype)
    model.tensor_parallel = groups
    model.__dict__.pop("_compact", None)           # the compact stack re-fuses the local shards
    return model


def _fill(model: nn.Module, slices: dict[str, Slice], full_shapes: dict[str, tuple[int, ...]],
          read: Reader, dtype: torch.dtype | None) -> None:
    """Give every parameter and persistent buffer its slice (replicated unless in `slices`)."""
    for name in list(model.state_dict()):
        module_path, _, attr = name.rpartition(".")
        module = model.get_submodule(module_path)
        tensor = read(name, slices.get(name, REPLICATED), full_shapes[name])
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        if attr in module._parameters:
            module._parameters[attr] = nn.Parameter(tensor, requires_grad=False)
        else:
            module._buffers[attr] = tensor


def take(full: Any, part: Slice, rank: int) -> Tensor | None:
    """`part` of a whole tensor, or of a lazy safetensors slice (`[a:b]`, `[:, a:b]`,
    `[:, :, a:b]`, `[:]`); None for a leader-only tensor on a rank other than 0 (it holds zeros)."""
    if part.leader_only and rank:
        return None
    if part.dim is None:
        return full[:]
    return full[(slice(None),) * part.dim + (slice(part.start, part.stop),)]


def placed(values: Tensor | None, part: Slice, shape: tuple[int, ...], dtype: torch.dtype,
           device: torch.device | str = "cpu") -> Tensor:
    """An owned tensor of the slice's local shape on `device`: `values` copied in, the rest zeros."""
    out = torch.zeros(part.local_shape(shape), dtype=dtype, device=device) if (
        values is None or part.dim is not None and part.stop - part.start < part.local) else \
        torch.empty(part.local_shape(shape), dtype=dtype, device=device)
    if values is not None:
        target = out if part.dim is None else out.narrow(part.dim, 0, part.stop - part.start)
        target.copy_(values)
    return out


def _from_tensors(whole: dict[str, Tensor], rank: int) -> Reader:
    def read(name: str, part: Slice, shape: tuple[int, ...]) -> Tensor:
        full = whole[name]           # the shard stays where the whole model was (a GPU's model on its GPU)
        return placed(take(full, part, rank), part, shape, full.dtype, full.device)

    return read
