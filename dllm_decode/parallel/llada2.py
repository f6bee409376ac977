"""Tensor plus expert parallelism for LLaDA2 (the MoE block-diffusion family).

Over one TP group of n ranks, rank r holds:

| part | held | collective |
|---|---|---|
| `attention.query_key_value` (one fused matrix, per head slot q heads, k heads, v heads) | [q heads of r \\| k heads of r \\| v heads of r], read as three row slices and joined | none |
| `attention.dense` | columns of r's heads (`RowParallelLinear`; its bias on TP rank 0 only) | all_reduce |
| q/k norms, the two layer norms, the final norm | whole | none |
| dense MLP layers (`first_k_dense_replace`) | gate, up rows; down columns (as the dense families) | all_reduce |
| MoE router (`mlp.gate`, with `expert_bias`) | whole: every rank routes the same tokens identically | none |
| routed experts | experts [r E/n, (r+1) E/n) whole, none of the others (`parallel.experts`) | all_reduce (float32) |
| shared experts | whole (small: one expert's width times `num_shared_experts`) | none |
| embedding, head | vocabulary rows (the dense families' modules, padded to a multiple of n) | all_reduce; all_gather of the window |

So a forward issues 2 all_reduces per layer, one for the embedding and one all_gather of the
window's logits: the dense families' count, the MoE layer's all_reduce in float32. A contiguous
row split of the fused q|k|v would give rank 0 mostly q heads, hence the three slices per rank.
KV heads follow the dense rule: split when Hkv % n == 0, replicated when n % Hkv == 0.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dllm_decode.models.layers import SwiGLU, TiedHead
from dllm_decode.models.llada2 import LLaDA2Layer, LLaDA2MoE, LLaDA2Model
from dllm_decode.parallel.collectives import all_reduce
from dllm_decode.parallel.experts import ExpertShard, expert_range
from dllm_decode.parallel.groups import ParallelError, ParallelGroups
from dllm_decode.parallel.layers import RowParallelLinear, VocabParallelEmbedding, VocabParallelHead
from dllm_decode.parallel.plan import (FAMILY_PLANS, Reader, Slice, _fill, _from_tensors,
                                       check_divisible, vocab_slice)


def _rows(start: int, stop: int) -> Slice:
    return Slice(0, start, stop, stop - start)


def qkv_slices(heads: int, kv_heads: int, head_dim: int, groups: ParallelGroups) -> list[Slice]:
    """The three row slices of the fused q|k|v this rank holds, in order q, k, v."""
    tp, rank = groups.tp, groups.tp_rank
    per_q = heads // tp
    q = (rank * per_q * head_dim, (rank + 1) * per_q * head_dim)
    if kv_heads % tp == 0:
        per_kv = kv_heads // tp
        kv = (rank * per_kv * head_dim, (rank + 1) * per_kv * head_dim)
    else:                                  # tp % Hkv == 0: each KV head on tp / Hkv ranks
        index = rank // (tp // kv_heads)
        kv = (index * head_dim, (index + 1) * head_dim)
    k0, v0 = heads * head_dim, (heads + kv_heads) * head_dim
    return [_rows(*q), _rows(k0 + kv[0], k0 + kv[1]), _rows(v0 + kv[0], v0 + kv[1])]


def shard_llada2(model: LLaDA2Model, groups: ParallelGroups, read: Reader | None = None,
                 dtype: torch.dtype | None = None) -> LLaDA2Model:
    """Shard a LLaDA2 model in place over `groups`' TP group (whole or on the meta device, as
    `plan.shard_model`); returns it.

    Raises:
        ParallelError: heads, MLP widths or the expert count do not divide by the TP size (the
            message lists the legal sizes).
    """
    cfg = model.config
    tp, rank, group = groups.tp, groups.tp_rank, groups.tp_group_name
    dense = any(not cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    check_divisible(cfg.num_attention_heads, cfg.num_key_value_heads,
                    cfg.intermediate_size if dense else tp, tp)
    if cfg.num_experts:
        try:
            lo, hi = expert_range(cfg.num_experts, rank, tp)
        except ValueError as err:
            raise ParallelError(f"tensor_parallel={tp}: {err}") from None
    if read is None:
        read = _from_tensors({k: v.detach() for k, v in model.state_dict().items()}, rank)
    full_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    slices: dict[str, Slice] = {}
    joined: dict[str, list[Slice]] = {}
    dim, heads, kv_heads, head_dim = (cfg.hidden_size, cfg.num_attention_heads,
                                      cfg.num_key_value_heads, cfg.head_dim)
    local_kv = kv_heads // tp if kv_heads % tp == 0 else 1
    parts = qkv_slices(heads, kv_heads, head_dim, groups)
    q_cols = (parts[0].start, parts[0].stop)
    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}"
        _shard_attention(layer, prefix, parts, q_cols, local_kv, group, slices, joined)
        layer.n_heads, layer.n_kv_heads = heads // tp, local_kv
        if isinstance(layer.mlp, LLaDA2MoE):
            _shard_moe(layer.mlp, lo, hi, group)
        else:
            _shard_swiglu(layer.mlp, f"{prefix}.mlp", tp, rank, group, slices)
    _shard_vocab(model, groups, slices)
    _fill(model, slices, full_shapes, _joining(read, joined), dtype)
    for moe in model.modules():
        if isinstance(moe, LLaDA2MoE) and moe.moe_impl == "static":
            moe._stacked = moe._stack()                  # stacked now, not while compiling
    model.tensor_parallel = groups
    return model


def _shard_attention(layer: LLaDA2Layer, prefix: str, parts: list[Slice], q_cols: tuple[int, int],
                     local_kv: int, group: str | None, slices: dict[str, Slice],
                     joined: dict[str, list[Slice]]) -> None:
    attn = layer.attention
    qkv, dense = attn["query_key_value"], attn["dense"]
    width = sum(p.local for p in parts)
    attn["query_key_value"] = nn.Linear(qkv.in_features, width, bias=qkv.bias is not None,
                                        device="meta")
    joined[f"{prefix}.attention.query_key_value.weight"] = parts
    if qkv.bias is not None:
        joined[f"{prefix}.attention.query_key_value.bias"] = parts
    local = q_cols[1] - q_cols[0]
    attn["dense"] = RowParallelLinear(local, dense.out_features, dense.bias is not None, group,
                                      device="meta")
    slices[f"{prefix}.attention.dense.weight"] = Slice(1, q_cols[0], q_cols[1], local)
    if dense.bias is not None:
        slices[f"{prefix}.attention.dense.bias"] = Slice(leader_only=True)


def _shard_swiglu(mlp: SwiGLU, prefix: str, tp: int, rank: int, group: str | None,
                  slices: dict[str, Slice]) -> None:
    width = mlp.gate_proj.out_features
    per = width // tp
    span = Slice(0, rank * per, (rank + 1) * per, per)
    for name in ("gate_proj", "up_proj"):
        setattr(mlp, name, nn.Linear(mlp.down_proj.out_features, per, bias=False, device="meta"))
        slices[f"{prefix}.{name}.weight"] = span
    mlp.down_proj = RowParallelLinear(per, mlp.down_proj.out_features, False, group, device="meta")
    slices[f"{prefix}.down_proj.weight"] = Slice(1, span.start, span.stop, per)


def _shard_moe(moe: LLaDA2MoE, lo: int, hi: int, group: str | None) -> None:
    """Hold experts [lo, hi) (read whole), drop the others; partial sums meet in one float32
    all_reduce."""
    moe.experts = ExpertShard({e: moe.experts[e] for e in range(lo, hi)})
    moe.expert_range = (lo, hi)
    moe.combine = lambda partial: all_reduce(partial, group)
    moe._stacked = None


def _shard_vocab(model: LLaDA2Model, groups: ParallelGroups, slices: dict[str, Slice]) -> None:
    cfg, group = model.config, groups.tp_group_name
    vocab = vocab_slice(cfg.vocab_size, groups)
    embed = VocabParallelEmbedding(vocab.local, cfg.hidden_size, vocab.start, group, device="meta")
    model.model.word_embeddings = embed
    slices["model.word_embeddings.weight"] = vocab
    tied = isinstance(model.lm_head, TiedHead)
    model.lm_head = VocabParallelHead(vocab.local, cfg.hidden_size, cfg.vocab_size, groups.tp,
                                      group, tied=embed if tied else None, device="meta")
    if not tied:
        slices["lm_head.weight"] = vocab


def _joining(read: Reader, joined: dict[str, list[Slice]]) -> Reader:
    """`read`, with the fused q|k|v names read as their three slices and joined."""
    def reader(name: str, part: Slice, shape: tuple[int, ...]) -> Tensor:
        if name in joined:
            return torch.cat([read(name, p, shape) for p in joined[name]])
        return read(name, part, shape)
    return reader


FAMILY_PLANS[LLaDA2Model] = shard_llada2
