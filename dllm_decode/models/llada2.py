"""LLaDA2.0 / LLaDA2.1 (inclusionAI/LLaDA2.0-mini, -flash; LLaDA2.1-*) in plain torch, released names.

LLaDA2 converts the Ling-2.0 MoE into a block-diffusion model (block 32, no token shift: row i
predicts position i). Layer: RMSNorm -> attention (one fused `query_key_value` projection split
per head slot into q, k, v; per-head RMSNorm on q and k; RoPE on the first
`head_dim * partial_rotary_factor` dims of each head; output `dense`, biased iff `use_bias`) ->
RMSNorm -> MLP: dense SwiGLU for layers < `first_k_dense_replace`, else a mixture of experts.

MoE router, as the reference `LLaDA2MoeGate` computes it:
fp32 logits `W_gate h`; scores = sigmoid (or softmax when `score_function` says so); experts are
chosen on `scores + expert_bias` with DeepSeek-V3's group-limited top-k (arXiv 2412.19437: groups
ranked by the sum of their top-2 scores, the best `topk_group` kept, then the top
`num_experts_per_tok` experts among them); each chosen expert is weighted by its raw score,
normalised over the chosen ones (`norm_topk_prob`) and multiplied by `routed_scaling_factor`;
`num_shared_experts` shared experts (one SwiGLU of width `moe_intermediate_size * n`) are added.

Config defaults for absent keys are the reference configuration class's, so a file is read as
the reference reads it. Deliberate difference: the reference builds a CAUSAL mask unless it is
handed a 4-D one (with no 4-D mask its SDPA path runs causally); here the block-causal mask comes from positions, always.
The block size is not in the released config.json: `block_size` (or `block_length`) there wins,
else 32, the reference `generate` default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode.models.layers import (BlockCausal, BlockStackLM, KVCache, RMSNorm, SwiGLU,
                                       TiedHead, attend)
from dllm_decode.models.decoder import check_block_size, check_mask_id, checked_head_dim

SCORE_FUNCTIONS = ("sigmoid", "softmax")


@dataclass(frozen=True)
class LLaDA2Config:
    """The `config.json` fields the forward pass reads (names as in `LLaDA2MoeConfig`)."""

    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int = 0                 # 0 -> num_attention_heads (LLaDA2.1's rule)
    head_dim: int | None = None                  # None -> hidden_size // num_attention_heads
    intermediate_size: int | None = None
    moe_intermediate_size: int | None = None
    num_experts: int | None = 16                 # None or 0 -> every layer dense
    num_experts_per_tok: int = 2
    num_shared_experts: int | None = 0
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    score_function: str = "sigmoid"
    norm_topk_prob: bool = True
    moe_router_enable_expert_bias: bool = True
    first_k_dense_replace: int = 0
    use_qk_norm: bool = True
    use_qkv_bias: bool = False
    use_bias: bool = True
    partial_rotary_factor: float = 0.5
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    vocab_size: int = 30592
    max_position_embeddings: int = 16384
    tie_word_embeddings: bool = False
    mask_token_id: int = 156895                  # reference `generate` defaults
    eos_token_id: int = 156892
    pad_token_id: int = 156892
    block_size: int = 32

    def __post_init__(self) -> None:
        if not self.num_key_value_heads:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        object.__setattr__(self, "head_dim", checked_head_dim(
            self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim))
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor} gives rotary "
                             f"width {self.rotary_dim}; it must be even and in (0, head_dim]")
        check_mask_id(self.mask_token_id, self.vocab_size)
        check_block_size("block_size", self.block_size)
        if self.score_function not in SCORE_FUNCTIONS:
            raise ValueError(f"score_function {self.score_function!r} is not supported; "
                             f"accepted: {list(SCORE_FUNCTIONS)}")
        if self.num_experts:
            self._check_moe()

    def _check_moe(self) -> None:
        if not self.moe_intermediate_size:
            raise ValueError("moe_intermediate_size must be set when num_experts > 0")
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                             f"[1, num_experts = {self.num_experts}]")
        if self.n_group > 1:
            if self.num_experts % self.n_group:
                raise ValueError(f"num_experts ({self.num_experts}) must be divisible by "
                                 f"n_group ({self.n_group})")
            if not 0 < self.topk_group <= self.n_group:
                raise ValueError(f"topk_group ({self.topk_group}) must be in [1, n_group = "
                                 f"{self.n_group}]")
            kept = self.topk_group * (self.num_experts // self.n_group)
            if kept < self.num_experts_per_tok:
                raise ValueError(f"topk_group ({self.topk_group}) groups hold {kept} experts, "
                                 f"fewer than num_experts_per_tok ({self.num_experts_per_tok})")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, index: int) -> bool:
        return bool(self.num_experts) and index >= self.first_k_dense_replace

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "LLaDA2Config":
        """Build from a released `config.json`; structural values this code does not implement raise."""
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"LLaDA2 config: hidden_act={raw['hidden_act']!r} is not supported; "
                             f"accepted: ['silu']")
        rope = raw.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"LLaDA2 config: rope_scaling {rope!r} is not supported; "
                             f"accepted: none or type 'default'")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in raw.items() if key in names}
        if "block_size" not in values and "block_length" in raw:
            values["block_size"] = raw["block_length"]
        if isinstance(values.get("eos_token_id"), list):
            values["eos_token_id"] = values["eos_token_id"][0]
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"],
                "hidden_act": "silu", "rope_scaling": None, "use_cache": False,
                **dataclasses.asdict(self)}


def group_limited_topk(scores: Tensor, k: int, n_group: int, topk_group: int) -> Tensor:
    """(N, E) routing scores -> (N, k) chosen experts, best first (DeepSeek-V3 group limiting).

    Experts are split into `n_group` contiguous groups; a group's score is the sum of its two
    best experts; only the `topk_group` best groups stay eligible. `n_group <= 1`: plain top-k.
    """
    if n_group <= 1:
        return scores.topk(k, dim=-1).indices
    n, experts = scores.shape
    grouped = scores.view(n, n_group, experts // n_group)
    group_scores = grouped.topk(min(2, experts // n_group), dim=-1).values.sum(-1)   # (N, G)
    kept = group_scores.topk(topk_group, dim=-1).indices
    eligible = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
    eligible = eligible.repeat_interleave(experts // n_group, dim=1)                # (N, E)
    return scores.masked_fill(~eligible, float("-inf")).topk(k, dim=-1).indices


class LLaDA2Router(nn.Module):
    """`mlp.gate`: weight (E, d) and the `expert_bias` buffer (used to choose, never to weight)."""

    def __init__(self, cfg: LLaDA2Config):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        bias = torch.zeros(cfg.num_experts) if cfg.moe_router_enable_expert_bias else None
        self.register_buffer("expert_bias", bias)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(N, d) tokens -> (N, k) expert ids and (N, k) float32 weights."""
        cfg = self.cfg
        logits = F.linear(x.float(), self.weight.float())                 # the router runs in fp32
        scores = logits.sigmoid() if cfg.score_function == "sigmoid" else logits.softmax(-1)
        choice = scores if self.expert_bias is None else scores + self.expert_bias.float()
        experts = group_limited_topk(choice, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group)
        weights = scores.gather(1, experts)
        if cfg.num_experts_per_tok > 1 and cfg.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return experts, weights * cfg.routed_scaling_factor


MOE_IMPLS = ("loop", "static")
"""How `LLaDA2MoE` runs its routed experts: `loop` (eager: only the experts that got tokens run, on
their tokens; one host sync per layer to list them) or `static` (every held expert runs on every
token as one batched matmul, weighted by an (N, E_held) routing matrix that is zero where a token
did not choose the expert: no host sync, no data-dependent shape, so it compiles with
`fullgraph=True` and can be captured). In float32 the two agree to float rounding."""


class LLaDA2MoE(nn.Module):
    """Routed experts (weighted sum in float32) plus the shared experts.

    `moe_impl` (one of `MOE_IMPLS`, default `loop`) picks how the routed experts run.
    `expert_range = (lo, hi)` are the global ids of the experts this module holds (all of them
    unless expert parallelism sharded it, `dllm_decode.parallel.experts`); `combine`, when set,
    turns this module's float32 partial sum into the sum over every holder (one all-reduce).
    The static form keeps the held experts' weights stacked ((E_held, 2F, d) gate|up and
    (E_held, d, F) down) with each expert's weights rebound as views of them, so there is one copy;
    `.to()` and friends drop the stack and the next static forward rebuilds it.
    """

    def __init__(self, cfg: LLaDA2Config):
        super().__init__()
        self.gate = LLaDA2Router(cfg)
        self.experts = nn.ModuleList(SwiGLU(cfg.hidden_size, cfg.moe_intermediate_size)
                                     for _ in range(cfg.num_experts))
        if cfg.num_shared_experts:
            self.shared_experts = SwiGLU(cfg.hidden_size,
                                         cfg.moe_intermediate_size * cfg.num_shared_experts)
        self.moe_impl = "loop"
        self.expert_range = (0, cfg.num_experts)
        self.combine: Callable[[Tensor], Tensor] | None = None
        self._stacked: tuple[Tensor, Tensor] | None = None

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self._stacked = None                   # the moved weights are no longer views of the stack
        return super()._apply(fn, *args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())    # a copy stacks its own weights
        state["_stacked"] = None
        return state

    def forward(self, h: Tensor) -> Tensor:
        x = h.reshape(-1, h.shape[-1])                                      # (N, d)
        experts, weights = self.gate(x)                                     # (N, k) each
        if self.moe_impl == "static":
            out = self._static(x, experts, weights)
        else:
            out = self._loop(x, experts, weights)
        if self.combine is not None:
            out = self.combine(out)
        out = out.to(h.dtype).view(h.shape)
        if hasattr(self, "shared_experts"):
            out = out + self.shared_experts(h)
        return out

    def _loop(self, x: Tensor, experts: Tensor, weights: Tensor) -> Tensor:
        lo, hi = self.expert_range
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in experts.unique().tolist():        # one host sync: only experts that got tokens run
            if not lo <= e < hi:
                continue
            token, slot = (experts == e).nonzero(as_tuple=True)
            y = self.experts[e - lo](x[token]).float() * weights[token, slot].unsqueeze(-1)
            out.index_add_(0, token, y)
        return out

    def _static(self, x: Tensor, experts: Tensor, weights: Tensor) -> Tensor:
        lo, hi = self.expert_range
        if self._stacked is None:
            self._stacked = self._stack()
        gate_up, down = self._stacked
        route = torch.zeros(x.shape[0], self.gate.cfg.num_experts, dtype=torch.float32,
                            device=x.device).scatter_(1, experts, weights)[:, lo:hi]   # (N, E_held)
        gate, up = torch.matmul(x, gate_up.transpose(1, 2)).chunk(2, dim=-1)        # (E_held, N, F)
        y = torch.bmm(F.silu(gate) * up, down.transpose(1, 2))                      # (E_held, N, d)
        return torch.einsum("end,ne->nd", y.float(), route)

    def _stack(self) -> tuple[Tensor, Tensor]:
        """Stack the held experts' weights once and rebind each expert's weights as views."""
        experts = list(self.experts)
        with torch.no_grad(), torch.inference_mode(experts[0].gate_proj.weight.is_inference()):
            gate_up = torch.stack([torch.cat([e.gate_proj.weight.detach(), e.up_proj.weight.detach()])
                                   for e in experts])
            down = torch.stack([e.down_proj.weight.detach() for e in experts])
            width = experts[0].gate_proj.weight.shape[0]
            for i, e in enumerate(experts):
                e.gate_proj.weight.data = gate_up[i, :width]
                e.up_proj.weight.data = gate_up[i, width:]
                e.down_proj.weight.data = down[i]
        return gate_up, down


def set_moe_impl(model: nn.Module, impl: str) -> nn.Module:
    """Run every `LLaDA2MoE` of `model` as `impl` (one of `MOE_IMPLS`); returns `model`.

    `static` stacks the experts' weights now, so that a compiled forward finds them stacked (a
    stack built while tracing would break the graph); after `.to()` the next forward restacks.
    """
    if impl not in MOE_IMPLS:
        raise ValueError(f"moe_impl {impl!r} is not supported; accepted: {list(MOE_IMPLS)}")
    for module in model.modules():
        if isinstance(module, LLaDA2MoE):
            module.moe_impl = impl
            if impl == "static" and module._stacked is None:
                module._stacked = module._stack()
    return model


class LLaDA2Layer(nn.Module):
    """One decoder layer under the released names (`attention.*`, `mlp.*`, two RMSNorms)."""

    def __init__(self, cfg: LLaDA2Config, index: int):
        super().__init__()
        self.cfg = cfg
        d, heads, kv_heads, dim = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.attention = nn.ModuleDict({
            "query_key_value": nn.Linear(d, (heads + 2 * kv_heads) * dim, bias=cfg.use_qkv_bias),
            "dense": nn.Linear(heads * dim, d, bias=cfg.use_bias),
        })
        if cfg.use_qk_norm:
            self.attention["query_layernorm"] = RMSNorm(dim, cfg.rms_norm_eps)
            self.attention["key_layernorm"] = RMSNorm(dim, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.mlp = LLaDA2MoE(cfg) if cfg.is_moe_layer(index) else SwiGLU(d, cfg.intermediate_size)
        self.n_heads, self.n_kv_heads = heads, kv_heads       # this rank's, under tensor parallelism

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor | None,
                kv: KVCache | None, layer: int, rows: tuple[int, int]) -> Tensor:
        cfg, attn = self.cfg, self.attention
        heads, kv_heads = self.n_heads, self.n_kv_heads
        qkv = attn["query_key_value"](self.input_layernorm(h)).unflatten(-1, (-1, cfg.head_dim))
        q, k, v = (t.flatten(-2) for t in qkv.split([heads, kv_heads, kv_heads], dim=-2))
        norms = (attn["query_layernorm"], attn["key_layernorm"]) if cfg.use_qk_norm else (None, None)
        o = attend(q, k, v, n_heads=heads, n_kv_heads=kv_heads, cos=cos, sin=sin,
                   key_mask=key_mask, kv=kv, layer=layer, rows=rows, rope_full_precision=False,
                   q_norm=norms[0], k_norm=norms[1])
        h = h + attn["dense"](o)
        return h + self.mlp(self.post_attention_layernorm(h))


class _LLaDA2Base(nn.Module):
    def __init__(self, cfg: LLaDA2Config):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LLaDA2Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LLaDA2Model(BlockCausal, BlockStackLM):
    """The DiffusionLM for LLaDA2.x checkpoints (state dict keys `model.*`, `lm_head.weight`)."""

    token_shift = 0

    def __init__(self, config: LLaDA2Config):
        super().__init__()
        self.config = config
        self.model = _LLaDA2Base(config)
        # the head is called as a module (a parallel plan replaces it); tied: no weights of its own
        self.lm_head = (TiedHead(self.model.word_embeddings) if config.tie_word_embeddings else
                        nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        self.block_size = config.block_size
        self.mask_token_id = config.mask_token_id
        self.eos_token_ids: tuple[int, ...] = (config.eos_token_id,)
        self.vocab_size = config.vocab_size
        self.max_length: int | None = config.max_position_embeddings

    def parts(self) -> tuple[nn.Embedding, nn.ModuleList]:
        return self.model.word_embeddings, self.model.layers

    def rotary_dim(self) -> int:
        return self.config.rotary_dim

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, kv: KVCache | None = None,
                rows: tuple[int, int] | None = None) -> Tensor:
        """Logits (B, b - a, V) for canvas rows `rows = (a, b)` (default all); see `DiffusionLM`."""
        h, _, _ = self.hidden_states(input_ids, attention_mask, positions, kv, rows)
        return self.lm_head(self.model.norm(h)).float()
