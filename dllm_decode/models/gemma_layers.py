"""The Gemma 4 text layer as DiffusionGemma computes it (transformers 5.24
`modeling_diffusion_gemma.py`): reference-order RMSNorm, default and proportional RoPE,
attention with q/k/v norms and scale 1 (keys as values on full layers), the dense GeGLU, the
softmax router and the routed experts (eager loop or static batched form)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode.models.gemma_config import DiffusionGemmaConfig

MOE_IMPLS = ("loop", "static")


def gemma_rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """The reference RMSNorm: normalise and scale in float32, then cast back."""
    x32 = x.float()
    y = x32 * torch.pow(x32.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        y = y * weight.float()
    return y.type_as(x)


class GemmaRMSNorm(nn.Module):
    """`weight` (absent for the unscaled norms) under the reference's names."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: Tensor) -> Tensor:
        return gemma_rms_norm(x, self.weight, self.eps)


def inv_frequencies(rope: tuple[str, float, float, float], head_dim: int) -> Tensor:
    """float32 (head_dim/2,) inverse frequencies: default RoPE, or proportional partial RoPE
    (the first `factor*d/2` angles at `theta^(-2j/d)`, the rest zero, all divided by `factor`)."""
    kind, theta, partial, factor = rope
    if kind == "default":
        dim = int(head_dim * partial)
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    angles = int(partial * head_dim // 2)
    rotated = 1.0 / (theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / head_dim))
    return torch.cat([rotated, torch.zeros(head_dim // 2 - angles)]) / factor


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """(B, Lq, H, D) `x` rotated half-split in its own dtype (cos/sin (1, Lq, 1, D))."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def gelu(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


class GemmaAttention(nn.Module):
    """q/k/v/o projections and q/k/v norms of one layer (no `v_proj` on full layers)."""

    def __init__(self, cfg: DiffusionGemmaConfig, layer: int):
        super().__init__()
        d, kv, h = cfg.layer_head_dims[layer], cfg.layer_kv_heads[layer], cfg.num_attention_heads
        self.head_dim, self.n_kv_heads, self.n_heads = d, kv, h
        self.sliding = cfg.layer_types[layer] == "sliding_attention"
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False) if self.sliding else None
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.q_norm = GemmaRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(d, cfg.rms_norm_eps)
        self.eps = cfg.rms_norm_eps

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, L, d) -> q (B, H, L, D), k and v (B, Hkv, L, D), normed and rotated."""
        b, n, _ = x.shape
        q = rotate(self.q_norm(self.q_proj(x).view(b, n, -1, self.head_dim)), cos, sin)
        raw_k = self.k_proj(x).view(b, n, -1, self.head_dim)
        raw_v = raw_k if self.v_proj is None else self.v_proj(x).view(b, n, -1, self.head_dim)
        k = rotate(self.k_norm(raw_k), cos, sin)
        v = gemma_rms_norm(raw_v, None, self.eps)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0,
                                             enable_gqa=self.n_heads != self.n_kv_heads)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class GemmaMLP(nn.Module):
    """Dense GeGLU: `down(gelu_tanh(gate(x)) * up(x))`."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(gelu(self.gate_proj(x)) * self.up_proj(x))


class GemmaRouter(nn.Module):
    """Softmax router: `proj(rmsnorm_noscale(h) * scale / sqrt(H))`, top-k renormalised, times
    `per_expert_scale` of the chosen experts."""

    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.num_experts))

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """(N, d) -> (N, k) expert ids and (N, k) float32 weights."""
        x = gemma_rms_norm(h, None, self.cfg.rms_norm_eps) * self.scale * self.cfg.hidden_size ** -0.5
        probs = F.softmax(self.proj(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, k=self.cfg.top_k_experts, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return experts, weights * self.per_expert_scale[experts]


class GemmaExperts(nn.Module):
    """Routed experts stored as the reference's 3-D tensors: `gate_up_proj` (E, 2F, d) with the
    gate first, `down_proj` (E, d, F).

    `moe_impl` (one of `MOE_IMPLS`): `loop` runs only the experts that got tokens (one host sync
    per layer); `static` runs every expert on every token as one batched matmul weighted by an
    (N, E) routing matrix that is zero where a token did not choose the expert (no host sync, no
    data-dependent shape: compilable and capturable, as LLaDA2's static form). Both add the
    weighted outputs in float32.
    """

    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__()
        self.num_experts = cfg.num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(cfg.num_experts, 2 * cfg.moe_intermediate_size,
                                                     cfg.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size,
                                                  cfg.moe_intermediate_size))
        self.moe_impl = "loop"
        self.expert_range = (0, cfg.num_experts)
        self.combine: Callable[[Tensor], Tensor] | None = None

    def hold(self, lo: int, hi: int, combine: Callable[[Tensor], Tensor] | None) -> None:
        """Keep only experts [lo, hi) of a whole set (expert parallelism: the others live on
        other ranks); `combine` sums the ranks' float32 partial outputs (an all_reduce)."""
        if self.expert_range != (0, self.num_experts):
            raise ValueError(f"these experts already hold only [{self.expert_range[0]}, "
                             f"{self.expert_range[1]}): shard a whole model")
        self.gate_up_proj = nn.Parameter(self.gate_up_proj.data[lo:hi].clone(), requires_grad=False)
        self.down_proj = nn.Parameter(self.down_proj.data[lo:hi].clone(), requires_grad=False)
        self.expert_range, self.combine = (lo, hi), combine

    def forward(self, x: Tensor, experts: Tensor, weights: Tensor) -> Tensor:
        lo, hi = self.expert_range
        if self.moe_impl == "static":
            route = torch.zeros(x.shape[0], self.num_experts, dtype=torch.float32,
                                device=x.device).scatter_(1, experts, weights)[:, lo:hi]  # (N, E held)
            gate, up = torch.matmul(x, self.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
            y = torch.bmm(gelu(gate) * up, self.down_proj.transpose(1, 2))              # (E, N, d)
            out = torch.einsum("end,ne->nd", y.float(), route)
        else:
            out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
            for e in experts.unique().tolist():
                if not lo <= e < hi:                    # another rank's expert
                    continue
                token, slot = (experts == e).nonzero(as_tuple=True)
                gate, up = F.linear(x[token], self.gate_up_proj[e - lo]).chunk(2, dim=-1)
                y = F.linear(gelu(gate) * up, self.down_proj[e - lo])
                out.index_add_(0, token, y.float() * weights[token, slot].unsqueeze(-1))
        if self.combine is not None:                    # the ranks' partial sums, in float32
            out = self.combine(out)
        return out.to(x.dtype)


class GemmaEmbedding(nn.Embedding):
    """The tied embedding in its three uses: the scaled lookup (`forward`, then times
    sqrt(hidden) by the caller), self-conditioning's soft embedding (`soft`: probabilities
    times the matrix) and the output head (`head`). Under tensor parallelism a vocabulary-parallel
    subclass holds one slice of the rows and issues the collectives
    (`dllm_decode.parallel.diffusion_gemma`)."""

    def soft(self, probs: Tensor) -> Tensor:
        """(..., V) probabilities (in the weight's dtype) times the (V, d) matrix."""
        return torch.matmul(probs, self.weight)

    def head(self, h: Tensor) -> Tensor:
        """(..., d) -> (..., V) logits in the weight's dtype."""
        return F.linear(h, self.weight)


class GemmaLayer(nn.Module):
    """One layer of the shared stack; the caller passes the mode's `layer_scalar`."""

    def __init__(self, cfg: DiffusionGemmaConfig, layer: int):
        super().__init__()
        eps, dim = cfg.rms_norm_eps, cfg.hidden_size
        self.self_attn = GemmaAttention(cfg, layer)
        self.mlp = GemmaMLP(dim, cfg.intermediate_size)
        self.router = GemmaRouter(cfg)
        self.experts = GemmaExperts(cfg)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_feedforward_layernorm_1",
                     "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
            setattr(self, name, GemmaRMSNorm(dim, eps))
        self.register_buffer("layer_scalar", torch.ones(1))

    def feed_forward(self, h: Tensor, scalar: Tensor) -> Tensor:
        """The dense and routed branches after attention, and the layer scalar."""
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(h)))
        flat = h.reshape(-1, h.shape[-1])
        experts, weights = self.router(flat)           # routes on the un-normalised residual
        routed = self.experts(self.pre_feedforward_layernorm_2(flat), experts, weights)
        routed = self.post_feedforward_layernorm_2(routed.view(h.shape))
        return (h + self.post_feedforward_layernorm(dense + routed)) * scalar


class SelfConditioning(GemmaMLP):
    """The decoder's self-conditioning GeGLU with its scaled `pre_norm` (its unscaled post-norm
    is applied by the caller)."""

    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__(cfg.hidden_size, cfg.intermediate_size)
        self.pre_norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def set_moe_impl(model: nn.Module, impl: str) -> nn.Module:
    """Run every `GemmaExperts` of `model` as `impl` (one of `MOE_IMPLS`); returns `model`."""
    if impl not in MOE_IMPLS:
        raise ValueError(f"moe_impl {impl!r} is not supported; accepted: {list(MOE_IMPLS)}")
    for module in model.modules():
        if isinstance(module, GemmaExperts):
            module.moe_impl = impl
    return model
