"""The compact runtime: the Llama-style pre-norm block re-run with only its tensor operations.

One implementation serves the diffusion models here (`BlockStackLM`: LLaDA, Dream, Fast-dLLM v2,
SDAR and the embedded models; `runtime="compact"`) and the AR mode's `CompactCausalLM`
(`dllm_decode.speculative.compact`). The block keeps the maths and drops ops (per-op cost is
what dominates an AR step of the embedded models):
  * q|k|v and gate|up are each one matrix, stored in the layout the CPU kernels are fastest at
    for the dtype (`transposed`);
  * in the AR runtime each RMSNorm's scale is folded into the rows of the matrix that follows it
    ((x * g) @ W = x @ (g[:, None] * W)): one multiply fewer per norm, equal up to float rounding;
  * q and k are rotated in one op, from cos/sin tables computed once per model and looked up by
    position (the same float32 values `layers.rope_tables` computes);
  * the K/V cache contract is the model's own (`layers.KVCache`), so every cache, trimming and row
    selection work unchanged;
  * the last block runs its queries and MLP only on the rows the forward returns (exact).
The diffusion models share their weights with it: q|k|v and gate|up are concatenated once and the
modules' own weights become views of those matrices (no second copy), and the norms' scales are
applied as the reference applies them, so the logits equal the reference's to float rounding
(bit-equal on CPU). The AR mode's `CompactCausalLM` instead folds the norm scales into its own
copies (its source model can be dropped). `load_model` runs compact by default
(`default_runtime`): on an H100 a batch-1 forward is launch-bound and compact is 1.4-1.5x faster
(`bench runtime --device cuda`, `bench shaped --runtime compact`); on this CPU the forward is
arithmetic-bound and compact is 0.96-1.32x (`bench runtime`). Under autograd (training) the model keeps its
reference forward.
The fused weights are rebuilt when a parameter changes (an optimizer step, `load_state_dict`,
`.to()`), detected by the parameters' version counters, pointers and dtypes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode.models.layers import COMPACT_MODULES, RUNTIME_STATE, KVCache, RMSNorm, rms_norm, rms_normalize, sdpa

DLLM_RUNTIMES = ("reference", "compact")
"""How a diffusion model (`BlockStackLM`) runs its blocks: `reference` (the modules as written in
`layers.py`) or `compact` (this module)."""


def transposed(weight: Tensor, norm_scale: Tensor | None = None) -> Tensor:
    """(out, in) -> the (in, out) operand of `x @ w`, columns scaled by the preceding norm's scale
    if given. Stored in the layout the CPU kernels are fastest at for its dtype: row-major (in, out)
    in float32; in bfloat16 / float16 the (out, in) rows (a transposed view), since the other
    layout runs about 5x slower there (measured with `bench runtime --dtype bfloat16`)."""
    w = weight.detach()
    if norm_scale is not None:
        w = w * norm_scale.detach()
    return w.t().contiguous() if w.dtype == torch.float32 else w.contiguous().t()


def project(x: Tensor, weight_t: Any, bias: Tensor | None) -> Tensor:
    """(N, in) @ (in, out) [+ bias]; a fused quantized layer (a module: codes, not a matrix)
    is called instead (its bias is its own)."""
    if not isinstance(weight_t, Tensor):
        return weight_t(x)
    return x @ weight_t if bias is None else torch.addmm(bias, x, weight_t)


def _share(*linears: nn.Linear) -> tuple[Tensor, Tensor | None]:
    """The (in, out) operand of the linears' stacked weights (in `transposed`'s layout) and their
    stacked bias, with each linear's weight and bias rebound as views of them: the reference
    modules and the compact runtime read one copy of the weights."""
    # the new storage is an inference tensor exactly when the old one was (a model loaded under
    # torch.inference_mode): a Parameter must not mix the two kinds
    with torch.no_grad(), torch.inference_mode(linears[0].weight.is_inference()):
        weights = [linear.weight.detach() for linear in linears]
        operand = transposed(torch.cat(weights) if len(weights) > 1 else weights[0])
        bias = None
        if linears[0].bias is not None:
            bias = torch.cat([linear.bias.detach() for linear in linears])
        start = 0
        for linear in linears:
            end = start + linear.weight.shape[0]
            linear.weight.data = operand[:, start:end].t()
            if bias is not None:
                linear.bias.data = bias[start:end]
            start = end
    return operand, bias


def _fused(*linears: nn.Module) -> tuple[Any, Tensor | None]:
    """`_share` for float linears; quantized ones (with `fuse_rows`: `dllm_decode.quant`) become
    one fused quantized layer, whose codes the originals then view, called as a module."""
    if all(isinstance(linear, nn.Linear) for linear in linears):
        return _share(*linears)
    return type(linears[0]).fuse_rows(list(linears)), None


class RotaryTable:
    """cos and sin of half-split (NeoX / HF-Llama) rotary embeddings for positions 0, 1, ...,
    grown by doubling. `sin` has its first half negated, so that a rotation is
    `x * cos + x.roll(D / 2, -1) * sin` (rotate_half(x) = cat(-x2, x1) = roll(x, D/2) with the
    first half negated): q and k rotate together in one op.

    Args:
        inv_freq: (D/2,) float32 inverse frequencies.
        dtype: the tables' dtype: float32 for models that rotate in full precision (LLaDA), the
            model dtype otherwise (Llama, Qwen, Dream).
        scale: attention scaling of the rotary type (1 for the default type).
    """

    def __init__(self, inv_freq: Tensor, dtype: torch.dtype, scale: float = 1.0):
        self.inv_freq = inv_freq.detach().float()
        self.dtype, self.scale = dtype, scale
        empty = torch.empty(0, 0, device=inv_freq.device)
        self.tables = (empty, empty)       # (cos, sin), replaced together: threads may read them

    @classmethod
    def for_theta(cls, head_dim: int, theta: float, dtype: torch.dtype,
                  device: torch.device) -> "RotaryTable":
        """The default rotary type (`layers.rope_tables`'s frequencies)."""
        return cls(1.0 / theta ** (torch.arange(0, head_dim, 2, device=device,
                                                dtype=torch.float32) / head_dim), dtype)

    def reserve(self, end: int) -> None:
        """Make the tables cover positions [0, end)."""
        if end <= self.tables[0].shape[0]:
            return
        positions = torch.arange(max(256, 2 * end), dtype=torch.float32, device=self.inv_freq.device)
        angles = positions[:, None] * self.inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        cos = (angles.cos() * self.scale).to(self.dtype)
        sin = (angles.sin() * self.scale).to(self.dtype)
        sin[:, :angles.shape[1] // 2] *= -1
        if end > self.tables[0].shape[0]:
            self.tables = (cos, sin)

    def span(self, start: int, end: int) -> tuple[Tensor, Tensor]:
        """(n, 1, D) rows for positions [start, end): broadcast over (B, n, heads, D)."""
        self.reserve(end)
        cos, sin = self.tables
        return cos[start:end, None], sin[start:end, None]

    def at(self, positions: Tensor, max_position: int | None = None) -> tuple[Tensor, Tensor]:
        """(*positions.shape, 1, D) rows for arbitrary positions; `max_position` (when the caller
        knows a bound) saves a host sync."""
        self.reserve((int(positions.max()) if max_position is None else max_position) + 1)
        flat = positions.reshape(-1)             # index_select: far cheaper than advanced indexing
        cos, sin = self.tables
        shape = (*positions.shape, 1, cos.shape[1])
        return cos.index_select(0, flat).view(shape), sin.index_select(0, flat).view(shape)


@dataclass(frozen=True)
class FusedBlock:
    """One Llama-style pre-norm block with fused projections (norm scales folded in, or shared
    weights and applied norms: `fuse`).

    `x + attn(norm(x))` then `x + down(silu(gate(norm(x))) * up(norm(x)))`; the attention itself
    (cache, mask) belongs to the caller, between `attention_inputs` and `finish`.

    Attributes:
        qkv: (d, (H + 2 Hkv) D), the attention norm's scale folded in unless `attn_scale` is set;
            qkv_bias its bias or None. In a quantized model (`share=True` only) qkv, out,
            gate_up and down are quantized layers (modules) fused before use, not matrices.
        out: (H D, d); out_bias its bias or None.
        gate_up: (d, 2 F), the MLP norm's scale folded in unless `ff_scale` is set; down: (F, d).
        q_scale, k_scale: (D,) per-head q/k norm scales (Qwen3 / SDAR), the norms' own weights
            (not copies: an update that bumps no version counter, as fused AdamW's, is seen),
            or None.
        attn_scale, ff_scale: the norms' scales when they are not folded into `qkv` / `gate_up`
            (a block fused with `share=True`), else None.
        out_reduce, down_reduce: under tensor parallelism, the all_reduce summing the ranks'
            partial outputs of the row-parallel o and down projections (their modules'
            `reduce`; `dllm_decode.parallel.layers.RowParallelLinear`), else None. The fused
            matrices are then this rank's shards: [q_r | k_r | v_r] and [gate_r | up_r].
    """

    qkv: Any
    qkv_bias: Tensor | None
    out: Any
    out_bias: Tensor | None
    gate_up: Any
    down: Any
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    q_scale: Tensor | None = None
    k_scale: Tensor | None = None
    qk_eps: float = 0.0
    ff_eps: float | None = None          # the MLP norm's, when it differs from `eps`
    attn_scale: Tensor | None = None
    ff_scale: Tensor | None = None
    out_reduce: Callable[[Tensor], Tensor] | None = None
    down_reduce: Callable[[Tensor], Tensor] | None = None

    @classmethod
    def fuse(cls, attn_norm: Tensor, q: nn.Linear, k: nn.Linear, v: nn.Linear, o: nn.Linear,
             ff_norm: Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear, *, heads: int,
             kv_heads: int, eps: float, q_norm: RMSNorm | None = None,
             k_norm: RMSNorm | None = None, share: bool = False, ff_eps: float | None = None,
             out_reduce: Callable[[Tensor], Tensor] | None = None,
             down_reduce: Callable[[Tensor], Tensor] | None = None) -> "FusedBlock":
        """From the block's modules (`attn_norm`, `ff_norm`: the norms' scales).

        `share=False` builds folded copies (the source can be dropped afterwards). `share=True`
        adds no memory: the modules' weights become views of the fused matrices (`_share`) and
        the norms' scales are applied as the reference applies them, not folded in.
        """
        head_dim = q.out_features // heads
        shape = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, eps=eps, ff_eps=ff_eps,
                     out_reduce=out_reduce, down_reduce=down_reduce)
        if q_norm is not None:
            shape.update(q_scale=q_norm.weight.detach(), k_scale=k_norm.weight.detach(),
                         qk_eps=q_norm.eps)
        if share:
            (qkv, qkv_bias), (out, out_bias) = _fused(q, k, v), _fused(o)
            down_t = _fused(down)[0]
            if not isinstance(out, Tensor):          # a quantized layer reduces in its forward
                shape.update(out_reduce=None)
            if not isinstance(down_t, Tensor):
                shape.update(down_reduce=None)
            return cls(qkv=qkv, qkv_bias=qkv_bias, out=out, out_bias=out_bias,
                       gate_up=_fused(gate, up)[0], down=down_t,
                       attn_scale=attn_norm.detach(), ff_scale=ff_norm.detach(), **shape)
        biases = [p.bias for p in (q, k, v)]
        return cls(
            qkv=transposed(torch.cat([p.weight for p in (q, k, v)]), attn_norm),
            qkv_bias=None if biases[0] is None else torch.cat(biases).detach(),
            out=transposed(o.weight), out_bias=None if o.bias is None else o.bias.detach(),
            gate_up=transposed(torch.cat([gate.weight, up.weight]), ff_norm),
            down=transposed(down.weight), **shape)

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the float matrices', or the norms' beside quantized layers)."""
        return self.qkv.dtype if isinstance(self.qkv, Tensor) else self.attn_scale.dtype

    @property
    def device(self) -> torch.device:
        return self.qkv.device if isinstance(self.qkv, Tensor) else self.attn_scale.device

    def normalized(self, h: Tensor, scale: Tensor | None, eps: float | None = None) -> Tensor:
        """RMSNorm of `h` (`eps`: default the block's), its scale applied unless folded into the
        next matrix."""
        eps = self.eps if eps is None else eps
        return rms_normalize(h, eps) if scale is None else rms_norm(h, scale, eps)

    def attention_inputs(self, h: Tensor, cos: Tensor, sin: Tensor,
                         full_precision: bool = False, packing: "Packing | None" = None,
                         ) -> tuple[Tensor, Tensor, Tensor]:
        """Rotated queries and keys and the values of `h` (B, n, d), or of `h` (N, d) packed by
        `packing` (its padding columns get zero queries, keys and values).

        Args:
            cos, sin: `RotaryTable` rows broadcasting over (B, n, H + Hkv, D).
            full_precision: rotate in float32 and cast back (LLaDA); else in the model dtype.
        Returns:
            q (B, H, n, D), k and v (B, Hkv, n, D), views (not contiguous).
        """
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        if packing is None:
            batch, n, _ = h.shape
            qkv = project(self.normalized(h, self.attn_scale).view(batch * n, -1), self.qkv, self.qkv_bias)
        else:
            batch, n = packing.batch, packing.n
            qkv = packing.unpack(project(self.normalized(h, self.attn_scale), self.qkv, self.qkv_bias))
            qkv = qkv.view(batch * n, -1)
        q_width = (heads + kv_heads) * head_dim
        qk = qkv[:, :q_width].view(batch, n, heads + kv_heads, head_dim)
        if self.q_scale is not None:
            scale = torch.cat([self.q_scale.expand(heads, head_dim),
                               self.k_scale.expand(kv_heads, head_dim)])
            qk = scale * rms_normalize(qk, self.qk_eps)
        dtype = qk.dtype
        if full_precision:
            qk = qk.float()
        qk = (qk * cos + qk.roll(head_dim // 2, -1) * sin).to(dtype).transpose(1, 2)
        v = qkv[:, q_width:].view(batch, n, kv_heads, head_dim).transpose(1, 2)
        return qk[:, :heads], qk[:, heads:], v

    def finish(self, h: Tensor, attended: Tensor, packing: "Packing | None" = None) -> Tensor:
        """`h` (B, n, d) plus the output projection of `attended` (B, H, n, D), then the MLP;
        with `packing`, `h` and the result are its (N, d) real columns."""
        batch, n = attended.shape[0], attended.shape[2]
        o = attended.transpose(1, 2).reshape(batch * n, self.heads * self.head_dim)
        if packing is not None:
            o = o.index_select(0, packing.index)
        attn = project(o, self.out, self.out_bias)
        if self.out_reduce is not None:
            attn = self.out_reduce(attn)
        h = h + attn.view(h.shape)
        gate, up = project(self.normalized(h, self.ff_scale, self.ff_eps), self.gate_up, None).chunk(2, -1)
        mlp = project(F.silu(gate) * up, self.down, None)
        return h + (mlp if self.down_reduce is None else self.down_reduce(mlp))


def compact_problem(model: Any) -> str | None:
    """Why `model` cannot run compact (a phrase), or None when it can."""
    from dllm_decode.models.layers import BlockStackLM, PreNormBlock

    if not isinstance(model, BlockStackLM):
        return f"{type(model).__name__} is not one of this package's plain-torch models"
    _, blocks = model.parts()
    if not all(isinstance(b, PreNormBlock) for b in blocks):
        return f"{type(model).__name__} has blocks other than the Llama-style pre-norm block"
    if model.rotary_dim() != model.config.head_dim:
        return "partial rotary embeddings"
    projections = [p for b in blocks for i, p in enumerate(b.parts()) if i not in (0, 5)]
    if all(isinstance(p, nn.Linear) for p in projections):
        return None
    if not all(hasattr(type(p), "fuse_rows") for p in projections):
        return "its projections are neither float nn.Linear layers nor quantized layers it can fuse"
    for b in blocks:
        _, q, k, v, _, _, gate, up, _ = b.parts()
        for group in ((q, k, v), (gate, up)):
            if len({(p.format, p.group_size, p.kernel, p.bias is None) for p in group}) > 1 or \
                    any(p.reduce is not None for p in group):
                return "its quantized q|k|v or gate|up layers differ in format, group or kernel"
    return None


def default_runtime(model: Any) -> str:
    """`compact` where it covers `model`, else `reference`: the compact runtime's logits are the
    reference's up to float rounding, it holds no second copy of the weights, and it is never
    slower in `bench runtime` / `bench shaped` (1.4x per forward at batch 1 on an H100)."""
    return "compact" if compact_problem(model) is None else "reference"


def set_runtime(model: Any, runtime: str) -> Any:
    """Run `model`'s blocks in `runtime` (one of `DLLM_RUNTIMES`); returns the model.

    Raises:
        ValueError: an unknown runtime, or `compact` for a model it does not cover (the message
            says why).
    """
    if runtime not in DLLM_RUNTIMES:
        raise ValueError(f"runtime must be one of {list(DLLM_RUNTIMES)}, got {runtime!r}")
    if runtime == "compact" and (problem := compact_problem(model)) is not None:
        raise ValueError(f"the compact runtime does not cover this model ({problem}); use "
                         f"runtime 'reference'")
    if runtime == "reference" and compact_problem(model) is not None:
        return model                                   # other model kinds have one forward only
    model.runtime = runtime
    model.block_runner = compact_stack if runtime == "compact" else None
    model.__dict__.pop(RUNTIME_STATE, None)
    return model


class CompactStack:
    """The blocks of a `BlockStackLM` in the compact runtime (built by `compact_stack`)."""

    def __init__(self, model: Any):
        _, blocks = model.parts()
        self.blocks = [_fuse_prenorm(block) for block in blocks]
        first = blocks[0]
        self.full_precision = bool(first.rope_full_precision)
        weight = self.blocks[0]
        self.rotary = RotaryTable.for_theta(
            model.rotary_dim(), model.config.rope_theta,
            torch.float32 if self.full_precision else weight.dtype, weight.device)

    def __call__(self, h: Tensor, positions: Tensor, key_mask: Tensor | None, kv: KVCache | None,
                 fed: tuple[int, int], max_position: int | None = None,
                 keep: tuple[int, int] | None = None, present: Tensor | None = None) -> Tensor:
        """The blocks over `h` (B, n, d), the canvas rows `fed`, at `positions` (B, n) (at most
        `max_position` when the caller knows it); returns the output rows `keep` = (i, j) of the
        n (default all). `present` (B, n) bool marks the fed columns that are not left padding.

        Exact shortcuts:
          * the last block's keys and values come from every fed row (they go to the cache), but
            its queries, output projection and MLP run on rows `keep` only: a forward asked for
            the active block and after (the loop's `rows`) skips them for the rows before;
          * on the CPU, the norms, projections and MLPs of a batch with left padding run on its
            real columns only (`Packing`); attention sees the padded layout, with zero keys and
            values at padding it never attends. The output at a padding column is zero (nothing
            reads it). A batch of prompts of different lengths spends most of a forward on these
            token-wise products, so padding was paid in full.
        """
        cos, sin = self.rotary.at(positions, max_position)
        last = len(self.blocks) - 1
        keep = keep or (0, h.shape[1])
        packing = Packing.of(present)
        if packing is not None:
            h = packing.pack(h)
        for layer, block in enumerate(self.blocks):
            q, k, v = block.attention_inputs(h, cos, sin, self.full_precision, packing)
            if kv is not None:
                k, v = kv.update(layer, k, v, fed)
            mask, first = key_mask, 0
            if layer == last and keep != (0, q.shape[2]) and not (kv is not None and kv.all_queries):
                if packing is not None:
                    h, packing = packing.unpack(h), None
                q, h, first = q[:, :, keep[0]:keep[1]], h[:, keep[0]:keep[1]], keep[0]
                if mask is not None and mask.shape[2] > 1:          # per-query (block-causal)
                    mask = mask[:, :, keep[0]:keep[1]]
            o = sdpa(q, k, v, mask) if kv is None else kv.attend(layer, q, k, v, mask, first)
            h = block.finish(h, o, packing)
        if packing is not None:
            h = packing.unpack(h)
        return h if h.shape[1] == keep[1] - keep[0] else h[:, keep[0]:keep[1]]


@dataclass(frozen=True)
class Packing:
    """The real columns of a left-padded (B, n) batch, as indices into its B * n flattened
    columns: token-wise work runs on those N rows, attention on the padded layout."""

    index: Tensor            # (N,) int64
    batch: int
    n: int

    @classmethod
    def of(cls, present: Tensor | None) -> "Packing | None":
        """The packing of `present` (B, n) bool, or None where the padded layout is kept: no
        padding; not on the CPU (counting the real columns would stop an accelerator's queue for
        a host sync every forward, and a captured step needs fixed shapes); under compilation."""
        if present is None or present.device.type != "cpu" or torch.compiler.is_compiling() \
                or bool(present.all()):
            return None
        return cls(present.reshape(-1).nonzero().squeeze(1), *present.shape)

    def pack(self, x: Tensor) -> Tensor:
        """(B, n, ...) -> (N, ...)."""
        return x.reshape(self.batch * self.n, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(N, ...) -> (B, n, ...), zero at padding."""
        out = x.new_zeros(self.batch * self.n, *x.shape[1:])
        return out.index_copy_(0, self.index, x).view(self.batch, self.n, *x.shape[1:])


def _fuse_prenorm(block: Any) -> FusedBlock:
    attn_norm, q, k, v, o, ff_norm, gate, up, down = block.parts()
    q_norm, k_norm = block.qk_norms()
    return FusedBlock.fuse(attn_norm.weight, q, k, v, o, ff_norm.weight, gate, up, down,
                           heads=block.n_heads, kv_heads=block.n_kv_heads, eps=attn_norm.eps,
                           q_norm=q_norm, k_norm=k_norm, share=True, ff_eps=ff_norm.eps,
                           out_reduce=getattr(o, "reduce", None),     # row-parallel under TP
                           down_reduce=getattr(down, "reduce", None))


def compact_stack(model: nn.Module) -> CompactStack:
    """`model`'s `CompactStack`, rebuilt when its parameters differ from those it was built from:
    other Parameter objects (`load_state_dict(assign=True)`), other storage (`.to()`) or an
    in-place change (an optimizer step, `load_state_dict`). Building is serialised, so threads
    sharing a model share one stack and one copy of the weights."""
    cached = model.__dict__.get(RUNTIME_STATE)
    if cached is not None and cached[0] == _fingerprint(model):
        return cached[1]
    with _BUILDING:
        cached = model.__dict__.get(RUNTIME_STATE)
        if cached is not None and cached[0] == _fingerprint(model):
            return cached[1]
        stack = CompactStack(model)          # rebinds the block weights as views of its matrices
        model.__dict__[RUNTIME_STATE] = (_fingerprint(model), stack)   # not a submodule
        return stack


_BUILDING = threading.Lock()


def _fingerprint(model: nn.Module) -> list[Any]:
    """Identity, storage, version and dtype of each parameter and buffer (a quantized layer's
    codes are buffers; inference tensors, made under `torch.inference_mode`, track no version
    and cannot change outside it). Read off each module's own tables every forward; only the
    list of modules is kept between forwards (`_modules_of`)."""
    modules = _modules_of(model)
    tensors = [p for m in modules for p in m._parameters.values() if p is not None]
    tensors += [b for m in modules if hasattr(type(m), "fuse_rows") for b in m._buffers.values() if b is not None]
    # besides tensors, the fused blocks read the norms' eps (a number a user may set)
    return [(id(p), p.data_ptr(), _version(p), p.dtype) for p in tensors] + \
        [m.eps for m in modules if isinstance(m, RMSNorm)]


def _modules_of(model: nn.Module) -> list[nn.Module]:
    """`model.modules()`, kept between forwards while every kept module has the same children
    (checked by identity: the kept list holds the old children, so no id is reused). Walking the
    model with its generators was most of a small model's per-forward check."""
    kept = model.__dict__.get(COMPACT_MODULES)
    if kept is not None and kept[1] == _children(kept[0]):
        return kept[0]
    modules = list(model.modules())
    model.__dict__[COMPACT_MODULES] = (modules, _children(modules))
    return modules


def _children(modules: list[nn.Module]) -> list[int]:
    return [id(child) for m in modules for child in m._modules.values()]


def _version(p: Tensor) -> int:
    try:
        return p._version
    except RuntimeError:                     # an inference tensor
        return -1
