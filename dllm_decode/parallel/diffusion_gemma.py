"""Tensor and expert parallelism for DiffusionGemma, the family's own plan.

It follows the reference config's `base_model_tp_plan` / `base_model_ep_plan` (transformers 5.24
`configuration_diffusion_gemma.py`), written with this package's explicit collectives. Over one
TP group of n ranks, rank r holds:

| part | held | collective |
|---|---|---|
| q_proj | rows of r's heads (H/n heads) | none |
| k_proj, v_proj (sliding layers); k_proj (full layers: keys are the values) | rows of r's KV heads, or the whole KV head r's queries read when n % Hkv == 0 (the 26B-A4B's 2 global KV heads at n = 4, 8) | none |
| q_norm, k_norm, the unscaled v norm | whole (per head, width D) | none |
| o_proj | columns of r's heads (`RowParallelLinear`) | all_reduce |
| dense MLP, self-conditioning MLP | gate, up rows; down columns | all_reduce |
| router (`proj`, `scale`, `per_expert_scale`), every RMSNorm, `layer_scalar`s | whole: every rank routes the same bytes identically | none |
| routed experts, `experts="expert"` (EP, the default) | experts [r E/n, (r+1) E/n) whole | all_reduce (float32) |
| routed experts, `experts="intermediate"` (the TP plan's `packed_colwise`) | every expert's gate and up rows [r F/n, (r+1) F/n) (each half of the fused gate_up split on its own), down columns | all_reduce (float32) |
| tied embedding = head | vocabulary rows (padded to a multiple of n): the lookup, self-conditioning's soft embedding and the softcapped head | all_reduce; all_reduce; all_gather |

The encoder and the decoder run the same sharded layers, so each rank's encoder cache holds its
own KV heads. A decoder step issues 2 all_reduces per layer plus one for the embedding lookup,
one for the soft embedding (from the second step of a canvas on) and one for the self-conditioning
MLP, and one all_gather of the canvas's logits; the logits after the gather are the same bytes on
every rank, so every rank draws the same noise from its own copy of the request's generator and
takes the same decisions. Partial sums (row layers, soft embedding) are added across ranks: equal
to one process within float rounding, not bitwise.

EP alone (attention replicated, as the reference's EP plan keeps it): `parallel.experts.shard_experts`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode.models.diffusion_gemma import DiffusionGemmaModel
from dllm_decode.models.gemma_config import DiffusionGemmaConfig
from dllm_decode.models.gemma_layers import GemmaAttention, GemmaExperts, GemmaMLP
from dllm_decode.parallel.collectives import all_gather_last, all_reduce
from dllm_decode.parallel.experts import expert_range
from dllm_decode.parallel.groups import ParallelError, ParallelGroups
from dllm_decode.parallel.layers import RowParallelLinear, VocabParallelEmbedding
from dllm_decode.parallel.plan import FAMILY_PLANS, Reader, Slice, _fill, _from_tensors, vocab_slice

EXPERT_LAYOUTS = ("expert", "intermediate")
"""How the routed experts are split: whole experts per rank (EP), or every expert's width (TP)."""


class VocabParallelGemmaEmbedding(VocabParallelEmbedding):
    """Rows [start, start + rows) of the tied embedding in its three uses (`GemmaEmbedding`'s
    `forward`, `soft`, `head`); `vocab_size` the real vocabulary (rows past it are zero padding)."""

    def __init__(self, rows: int, dim: int, start: int, vocab_size: int, tp: int,
                 group_name: str | None, device: torch.device | str | None = None):
        super().__init__(rows, dim, start, group_name, device=device)
        self.vocab_size, self.tp = vocab_size, tp

    def soft(self, probs: Tensor) -> Tensor:
        """Probabilities times the matrix: this rank's columns of `probs` times its rows, summed
        over the ranks."""
        real = max(0, min(self.weight.shape[0], self.vocab_size - self.start))
        local = torch.matmul(probs[..., self.start:self.start + real], self.weight[:real])
        return all_reduce(local, self.group_name)

    def head(self, h: Tensor) -> Tensor:
        return all_gather_last(F.linear(h, self.weight), self.tp, self.group_name)[..., :self.vocab_size]


def _kv_legal(kv: int, tp: int) -> bool:
    return kv % tp == 0 or tp % kv == 0


def legal_sizes(cfg: DiffusionGemmaConfig, experts: str, limit: int = 64) -> list[int]:
    """The TP sizes (up to `limit`) this config splits into under the `experts` layout."""
    return [tp for tp in range(1, limit + 1) if not _problems(cfg, experts, tp)]


def _problems(cfg: DiffusionGemmaConfig, experts: str, tp: int) -> list[str]:
    problems = []
    if cfg.num_attention_heads % tp:
        problems.append(f"{cfg.num_attention_heads} attention heads")
    for kv in sorted(set(cfg.layer_kv_heads)):
        if not _kv_legal(kv, tp):
            problems.append(f"{kv} key/value heads (neither divides the other)")
    if cfg.intermediate_size % tp:
        problems.append(f"MLP width {cfg.intermediate_size}")
    if experts == "expert" and cfg.num_experts % tp:
        problems.append(f"{cfg.num_experts} experts")
    if experts == "intermediate" and cfg.moe_intermediate_size % tp:
        problems.append(f"expert width {cfg.moe_intermediate_size}")
    return problems


def check_sizes(cfg: DiffusionGemmaConfig, experts: str, tp: int) -> None:
    """Raise `ParallelError` naming what does not divide and the legal sizes."""
    if experts not in EXPERT_LAYOUTS:
        raise ParallelError(f"experts layout {experts!r} is not supported; accepted: {list(EXPERT_LAYOUTS)}")
    problems = _problems(cfg, experts, tp)
    if problems:
        other = "intermediate" if experts == "expert" else "expert"
        raise ParallelError(f"tensor_parallel={tp} cannot split {' and '.join(problems)}; legal "
                            f"sizes for this model: {legal_sizes(cfg, experts)} (experts split by "
                            f"{experts}; by {other}: {legal_sizes(cfg, other)})")


def _rows(start: int, stop: int, dim: int = 0) -> Slice:
    return Slice(dim, start, stop, stop - start)


class _Sharder:
    """Replaces modules with their meta-device shards and records each name's `Slice`."""

    def __init__(self, groups: ParallelGroups):
        self.tp, self.rank, self.group = groups.tp, groups.tp_rank, groups.tp_group_name
        self.slices: dict[str, Slice] = {}
        self.joined: dict[str, tuple[int, list[Slice]]] = {}

    def span(self, count: int, width: int) -> tuple[int, int]:
        per = count // self.tp
        return self.rank * per * width, (self.rank + 1) * per * width

    def column(self, parent: nn.Module, attr: str, name: str, span: tuple[int, int]) -> None:
        old = getattr(parent, attr)
        setattr(parent, attr, nn.Linear(old.in_features, span[1] - span[0], bias=False, device="meta"))
        self.slices[f"{name}.weight"] = _rows(*span)

    def row(self, parent: nn.Module, attr: str, name: str, span: tuple[int, int]) -> None:
        old = getattr(parent, attr)
        setattr(parent, attr, RowParallelLinear(span[1] - span[0], old.out_features, False, self.group,
                                                device="meta"))
        self.slices[f"{name}.weight"] = _rows(*span, dim=1)

    def attention(self, attn: GemmaAttention, name: str) -> None:
        d, heads, kv = attn.head_dim, attn.n_heads, attn.n_kv_heads
        q = self.span(heads, d)
        if kv % self.tp == 0:
            kv_rows = self.span(kv, d)
        else:                                   # tp % Hkv == 0: each KV head on tp / Hkv ranks
            index = self.rank // (self.tp // kv)
            kv_rows = (index * d, (index + 1) * d)
        self.column(attn, "q_proj", f"{name}.q_proj", q)
        self.column(attn, "k_proj", f"{name}.k_proj", kv_rows)
        if attn.v_proj is not None:
            self.column(attn, "v_proj", f"{name}.v_proj", kv_rows)
        self.row(attn, "o_proj", f"{name}.o_proj", q)
        attn.n_heads, attn.n_kv_heads = heads // self.tp, (kv_rows[1] - kv_rows[0]) // d

    def mlp(self, mlp: GemmaMLP, name: str) -> None:
        span = self.span(mlp.gate_proj.out_features, 1)
        self.column(mlp, "gate_proj", f"{name}.gate_proj", span)
        self.column(mlp, "up_proj", f"{name}.up_proj", span)
        self.row(mlp, "down_proj", f"{name}.down_proj", span)

    def experts(self, experts: GemmaExperts, name: str, layout: str) -> None:
        count, fused, dim = experts.gate_up_proj.shape
        width = fused // 2
        if layout == "expert":
            lo, hi = expert_range(count, self.rank, self.tp)
            gate_up, down = (hi - lo, fused, dim), (hi - lo, dim, width)
            self.slices[f"{name}.gate_up_proj"] = self.slices[f"{name}.down_proj"] = _rows(lo, hi)
            experts.expert_range = (lo, hi)
        else:                                   # each half of [gate; up] split on its own
            a, b = self.span(width, 1)
            gate_up, down = (count, 2 * (b - a), dim), (count, dim, b - a)
            self.joined[f"{name}.gate_up_proj"] = (1, [_rows(a, b, 1), _rows(width + a, width + b, 1)])
            self.slices[f"{name}.down_proj"] = _rows(a, b, 2)
        experts.gate_up_proj = nn.Parameter(torch.empty(gate_up, device="meta"), requires_grad=False)
        experts.down_proj = nn.Parameter(torch.empty(down, device="meta"), requires_grad=False)
        group = self.group
        experts.combine = lambda partial: all_reduce(partial, group)

    def reader(self, read: Reader) -> Reader:
        """`read`, with the split-in-two names read as their slices and joined."""
        def joined(name: str, part: Slice, shape: tuple[int, ...]) -> Tensor:
            if name in self.joined:
                dim, parts = self.joined[name]
                return torch.cat([read(name, p, shape) for p in parts], dim)
            return read(name, part, shape)
        return joined


def shard_diffusion_gemma(model: DiffusionGemmaModel, groups: ParallelGroups, read: Reader | None = None,
                          dtype: torch.dtype | None = None, experts: str = "expert") -> DiffusionGemmaModel:
    """Shard a DiffusionGemma model in place over `groups`' TP group (whole, or built on the meta
    device with `read` giving each rank's slices, as `plan.shard_model`); returns it.

    Args:
        experts: `expert` (each rank holds E/n whole experts) or `intermediate` (every expert's
            width split, the reference TP plan's `packed_colwise`).
    Raises:
        ParallelError: a layout or a size that does not divide (the message lists the legal sizes).
    """
    if groups.single:
        return model
    cfg = model.config
    check_sizes(cfg, experts, groups.tp)
    if read is None:
        read = _from_tensors({k: v.detach() for k, v in model.state_dict().items()}, groups.tp_rank)
    full_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shard = _Sharder(groups)
    dec = model.model.decoder
    for i, layer in enumerate(dec.layers):
        prefix = f"model.decoder.layers.{i}"
        shard.attention(layer.self_attn, f"{prefix}.self_attn")
        shard.mlp(layer.mlp, f"{prefix}.mlp")
        shard.experts(layer.experts, f"{prefix}.experts", experts)
    shard.mlp(dec.self_conditioning, "model.decoder.self_conditioning")
    vocab = vocab_slice(cfg.vocab_size, groups)
    dec.embed_tokens = VocabParallelGemmaEmbedding(vocab.local, cfg.hidden_size, vocab.start, cfg.vocab_size,
                                                   groups.tp, groups.tp_group_name, device="meta")
    shard.slices["model.decoder.embed_tokens.weight"] = vocab
    _fill(model, shard.slices, full_shapes, shard.reader(read), dtype)
    model._tables.clear()
    model.tensor_parallel = groups
    return model


FAMILY_PLANS[DiffusionGemmaModel] = shard_diffusion_gemma
