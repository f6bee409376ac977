"""DiffusionGemma (google/diffusiongemma-*, transformers' `DiffusionGemmaForBlockDiffusion`) in
plain torch, text only.

A uniform-noise block-diffusion LM on the Gemma 4 text stack. One set of transformer weights
runs two ways: a causal *encoder* pass over the committed tokens fills a KV cache
(`EncoderCache`), and a bidirectional *decoder* pass (`denoise`) predicts a whole canvas of
`canvas_length` tokens from the current (noisy) canvas, the read-only cache and
self-conditioning on the previous step's logits. The encoder and decoder share every weight
except the per-layer `layer_scalar` buffers and the decoder's self-conditioning MLP.

Layer (transformers 5.24 `modeling_diffusion_gemma.py`, encoder and decoder bodies alike):
pre/post-normed attention with per-head q/k RMSNorm, an unscaled v RMSNorm, attention scale 1.0
and, on full-attention layers, `value = k_proj(x)` (no `v_proj`); then a dense GeGLU MLP beside
routed experts (softmax router over an unscaled-RMS-normed residual, top-k renormalised and
times `per_expert_scale`), each branch post-normed, summed, normed again, added, and the result
times `layer_scalar`. Sliding layers use default RoPE on their head dim and attend the last
`sliding_window` positions (the cache keeps W-1 of them); full layers use proportional partial
RoPE (`inv_freq[j] = theta^(-2j/d)` for j < factor*d/2, zeros after) on their own (global) head
dim and kv-head count. Logits: tied head, float32, `30 * tanh(z / 30)`.

RMSNorm multiplies by its weight in float32 before casting back (the reference order, unlike
`layers.rms_norm`); embeddings are scaled by sqrt(hidden) cast to the weight dtype first.
Positions are canvas columns shared by the batch (`arange`), as the reference `generate` uses
them: a left-padded row's tokens sit later than alone (RoPE is relative, so the logits agree to
rounding), and a sliding window counts padding columns, as in the reference.
Deviation: a padding query (which no real row reads) attends itself, so nothing is NaN.
Images: refused (`check_text_only`); the vision tower's weights are not loaded.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROPE_TYPES = ("default", "proportional")
LAYER_TYPES = ("sliding_attention", "full_attention")
MOE_IMPLS = ("loop", "static")


@dataclass(frozen=True)
class DiffusionGemmaConfig:
    """The text stack and canvas fields of a `diffusion_gemma` config.json (the reference
    class defaults for absent keys). Per-layer head dims and kv-head counts are resolved once."""

    vocab_size: int = 262144
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 30
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    rms_norm_eps: float = 1e-6
    sliding_window: int = 512
    final_logit_softcapping: float = 30.0
    num_experts: int = 0
    top_k_experts: int = 0
    moe_intermediate_size: int = 0
    max_position_embeddings: int = 131072
    layer_types: tuple[str, ...] = ()
    layer_head_dims: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    rope: dict[str, tuple[str, float, float, float]] = field(default_factory=dict)
    canvas_length: int = 256
    image_token_id: int = 258880
    eos_token_id: int | None = 1
    pad_token_id: int | None = 0
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = self.num_hidden_layers
        if not (len(self.layer_types) == len(self.layer_head_dims) == len(self.layer_kv_heads) == n):
            raise ValueError(f"layer_types must name {n} layers, got {len(self.layer_types)}")
        if bad := sorted(set(self.layer_types) - set(LAYER_TYPES)):
            raise ValueError(f"layer type {bad[0]!r} is not supported; accepted: {list(LAYER_TYPES)}")
        for kind in set(self.layer_types):
            if kind not in self.rope or self.rope[kind][0] not in ROPE_TYPES:
                raise ValueError(f"rope_parameters[{kind!r}] {self.rope.get(kind)!r} is not supported; "
                                 f"accepted rope_type: {list(ROPE_TYPES)}")
        for i, (d, kv) in enumerate(zip(self.layer_head_dims, self.layer_kv_heads)):
            if d % 2 or kv < 1 or self.num_attention_heads % kv:
                raise ValueError(f"layer {i}: head_dim {d} must be even and num_key_value_heads {kv} "
                                 f"must divide num_attention_heads {self.num_attention_heads}")
        if self.num_experts < 1 or not 0 < self.top_k_experts <= self.num_experts \
                or self.moe_intermediate_size < 1:
            raise ValueError(f"num_experts ({self.num_experts}), top_k_experts "
                             f"({self.top_k_experts}) and moe_intermediate_size must be set, "
                             f"with 1 <= top_k_experts <= num_experts")
        if self.canvas_length < 1 or self.sliding_window < 2:
            raise ValueError(f"canvas_length ({self.canvas_length}) must be >= 1 and sliding_window "
                             f"({self.sliding_window}) >= 2")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "DiffusionGemmaConfig":
        """Read a released config.json (nested `text_config`), resolving what the reference's
        `__post_init__` derives: layer types (5 sliding : 1 full, last layer full), the
        per-layer head dims and kv heads (`per_layer_config`, or `global_head_dim` /
        `num_global_key_value_heads`), the halved window under bidirectional attention."""
        text = raw.get("text_config") or {}
        if not isinstance(text, dict):
            raise ValueError("text_config must be a JSON object")
        if text.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_activation {text['hidden_activation']!r} is not supported; "
                             f"accepted: ['gelu_pytorch_tanh']")
        if text.get("attention_bias"):
            raise ValueError("attention_bias true is not supported; accepted: false")
        bidirectional = text.get("use_bidirectional_attention")
        if bidirectional not in (None, "vision"):
            raise ValueError(f"use_bidirectional_attention {bidirectional!r} is not supported; "
                             f"accepted: null or 'vision' (a causal text encoder)")
        n = int(text.get("num_hidden_layers", 30))
        types = list(text.get("layer_types") or
                     ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)])
        if types:
            types[-1] = "full_attention"           # the reference forces the last layer full
        head_dim, kv_heads = int(text.get("head_dim", 256)), int(text.get("num_key_value_heads", 4))
        overrides = text.get("per_layer_config")
        if overrides is None:
            full = {"head_dim": text.get("global_head_dim", 512)}
            if text.get("num_global_key_value_heads") is not None and text.get("attention_k_eq_v", True):
                full["num_key_value_heads"] = text["num_global_key_value_heads"]
            overrides = {str(i): full for i, t in enumerate(types) if t == "full_attention"}
        per_layer = [dict(overrides.get(str(i), overrides.get(i, {})) or {}) for i in range(len(types))]
        rope_raw = text.get("rope_parameters") or {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1e6}}
        rope = {kind: (str(p.get("rope_type", "default")), float(p.get("rope_theta", 10000.0)),
                       float(p.get("partial_rotary_factor", 1.0)), float(p.get("factor", 1.0)))
                for kind, p in rope_raw.items() if isinstance(p, dict)}
        return cls(vocab_size=int(text.get("vocab_size", 262144)),
                   hidden_size=int(text.get("hidden_size", 2304)),
                   intermediate_size=int(text.get("intermediate_size", 9216)),
                   num_hidden_layers=n, num_attention_heads=int(text.get("num_attention_heads", 8)),
                   num_key_value_heads=kv_heads, head_dim=head_dim,
                   rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
                   sliding_window=int(text.get("sliding_window", 512)),
                   final_logit_softcapping=float(text.get("final_logit_softcapping") or 30.0),
                   num_experts=int(text.get("num_experts") or 0),
                   top_k_experts=int(text.get("top_k_experts") or 0),
                   moe_intermediate_size=int(text.get("moe_intermediate_size") or 0),
                   max_position_embeddings=int(text.get("max_position_embeddings", 131072)),
                   layer_types=tuple(types),
                   layer_head_dims=tuple(int(p.get("head_dim", head_dim)) for p in per_layer),
                   layer_kv_heads=tuple(int(p.get("num_key_value_heads", kv_heads)) for p in per_layer),
                   rope=rope, canvas_length=int(raw.get("canvas_length", 256)),
                   image_token_id=int(raw.get("image_token_id", 258880)),
                   eos_token_id=_first(text.get("eos_token_id", 1)),
                   pad_token_id=_first(text.get("pad_token_id", 0)), raw=raw)

    def to_dict(self) -> dict[str, Any]:
        """The config.json this was read from (the reference layout)."""
        return dict(self.raw)


def _first(value: Any) -> int | None:
    return value[0] if isinstance(value, list) and value else value


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

    def forward(self, x: Tensor, experts: Tensor, weights: Tensor) -> Tensor:
        if self.moe_impl == "static":
            route = torch.zeros(x.shape[0], self.num_experts, dtype=torch.float32,
                                device=x.device).scatter_(1, experts, weights)          # (N, E)
            gate, up = torch.matmul(x, self.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
            y = torch.bmm(gelu(gate) * up, self.down_proj.transpose(1, 2))              # (E, N, d)
            return torch.einsum("end,ne->nd", y.float(), route).to(x.dtype)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in experts.unique().tolist():
            token, slot = (experts == e).nonzero(as_tuple=True)
            gate, up = F.linear(x[token], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(gelu(gate) * up, self.down_proj[e])
            out.index_add_(0, token, y.float() * weights[token, slot].unsqueeze(-1))
        return out.to(x.dtype)


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


@dataclass
class EncoderCache:
    """The encoder's K/V of every committed token, per layer (B, Hkv, S, D): full layers keep
    all, sliding layers the last W-1 (chronological). `mask` (B, T) bool marks the real
    (non-padding) columns of all T tokens encoded so far; `seen` is T; `padded` whether any
    column is padding (without, attention runs unmasked, as the reference's does)."""

    keys: list[Tensor]
    values: list[Tensor]
    mask: Tensor
    seen: int
    padded: bool = True

    def layer_mask(self, layer: int) -> Tensor:
        """(B, S) real-column mask of the keys layer `layer` keeps."""
        return self.mask[:, self.mask.shape[1] - self.keys[layer].shape[2]:]

    def select_rows(self, rows: Tensor) -> "EncoderCache":
        pick = lambda t: t.index_select(0, rows.to(t.device))   # noqa: E731
        return EncoderCache([pick(k) for k in self.keys], [pick(v) for v in self.values],
                            pick(self.mask), self.seen, self.padded)


class DiffusionGemmaModel(nn.Module):
    """The text model: `encode` fills an `EncoderCache`, `denoise` returns a canvas's logits.

    State-dict names are the reference's: the shared stack lives under `model.decoder.*`, the
    encoder's own per-layer `layer_scalar` under `model.encoder.language_model.layers.{i}.`.
    """

    canvas_kind: ClassVar[str] = "noise"     # an uncommitted column holds a random token, not [MASK]
    supports_kv = False                      # the masked loop's caches do not apply
    mask_token_id = None

    def __init__(self, cfg: DiffusionGemmaConfig):
        super().__init__()
        self.config = cfg
        self.vocab_size = cfg.vocab_size
        self.canvas_length = cfg.canvas_length
        self.max_length = cfg.max_position_embeddings
        self.eos_token_ids: tuple[int, ...] = () if cfg.eos_token_id is None else (cfg.eos_token_id,)
        self.model = nn.Module()
        self.model.decoder = nn.Module()
        dec = self.model.decoder
        dec.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        dec.layers = nn.ModuleList(GemmaLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        dec.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        dec.self_conditioning = SelfConditioning(cfg)
        self.model.encoder = nn.Module()
        self.model.encoder.language_model = nn.Module()
        enc_layers = nn.ModuleList(nn.Module() for _ in range(cfg.num_hidden_layers))
        for layer in enc_layers:
            layer.register_buffer("layer_scalar", torch.ones(1))
        self.model.encoder.language_model.layers = enc_layers
        self._tables: dict[tuple[str, int], Tensor] = {}

    # -- loading -------------------------------------------------------------------------------

    def load_reference_state(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The reference checkpoint's tensors this module holds: tied copies (encoder text weights, `lm_head`) and the vision tower dropped.
        Raises ValueError when a stored encoder copy differs from the decoder weight it ties to."""
        out: dict[str, Tensor] = {}
        enc = "model.encoder.language_model."
        for name, tensor in state.items():
            if name.startswith(enc) and not name.endswith("layer_scalar"):
                twin = state.get("model.decoder." + name[len(enc):])
                if twin is not None and not torch.equal(twin, tensor):
                    raise ValueError(f"{name} differs from the decoder weight it is tied to; "
                                     f"untied encoder weights are not supported")
                continue
            if name == "lm_head.weight" or name.startswith(("model.encoder.vision_tower.",
                                                            "model.encoder.embed_vision.")):
                continue
            out[name] = tensor
        return out

    # -- pieces --------------------------------------------------------------------------------

    def embed(self, ids: Tensor) -> Tensor:
        weight = self.model.decoder.embed_tokens.weight
        scale = torch.tensor(math.sqrt(self.config.hidden_size)).to(weight.dtype)
        return F.embedding(ids, weight) * scale

    def rope(self, layer: int, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(1, L, 1, D) cos and sin of `layer`'s rope type at `positions` (L,), in `dtype`."""
        kind, d = self.config.layer_types[layer], self.config.layer_head_dims[layer]
        inv = self._tables.get((kind, d))
        if inv is None or inv.device != positions.device:
            inv = self._tables[(kind, d)] = inv_frequencies(self.config.rope[kind], d).to(positions.device)
        angles = positions.float()[:, None] * inv
        angles = torch.cat([angles, angles], -1)[None, :, None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def logits(self, h: Tensor) -> Tensor:
        """Final norm, tied head, float32, softcap."""
        cap = self.config.final_logit_softcapping
        z = F.linear(self.model.decoder.norm(h), self.model.decoder.embed_tokens.weight).float()
        return torch.tanh(z / cap) * cap

    def check_text_only(self, ids: Tensor) -> None:
        """Raise a one-line ValueError for a prompt with image tokens (text only here)."""
        if bool((ids == self.config.image_token_id).any()):
            raise ValueError(f"the prompt holds image tokens (id {self.config.image_token_id}); "
                             f"this DiffusionGemma port is text only")

    # -- the two passes ------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, ids: Tensor, attention_mask: Tensor | None = None,
               cache: EncoderCache | None = None) -> EncoderCache:
        """Causal pass over (B, L) `ids` after the cached tokens; returns the extended cache."""
        self.check_text_only(ids)
        b, n = ids.shape
        dev = ids.device
        mask = torch.ones(b, n, dtype=torch.bool, device=dev) if attention_mask is None else attention_mask.bool()
        start = 0 if cache is None else cache.seen
        full_mask = mask if cache is None else torch.cat([cache.mask, mask], 1)
        positions = torch.arange(start, start + n, device=dev)
        h = self.embed(ids)
        keys, values = [], []
        for i, layer in enumerate(self.model.decoder.layers):
            attn = layer.self_attn
            cos, sin = self.rope(i, positions, h.dtype)
            q, k, v = attn.project(layer.input_layernorm(h), cos, sin)
            if cache is not None:
                k = torch.cat([cache.keys[i], k], 2)
                v = torch.cat([cache.values[i], v], 2)
            key_pos = torch.arange(start + n - k.shape[2], start + n, device=dev)
            allowed = key_pos[None, :] <= positions[:, None]
            if attn.sliding:
                allowed = allowed & (key_pos[None, :] > positions[:, None] - self.config.sliding_window)
            allowed = allowed[None] & full_mask[:, None, -k.shape[2]:]                   # (B, L, S)
            allowed = allowed | (key_pos[None, None, :] == positions[None, :, None]) & ~mask[:, :, None]
            a = attn.attend(q, k, v, allowed[:, None])
            h = h + layer.post_attention_layernorm(a)
            h = layer.feed_forward(h, self.model.encoder.language_model.layers[i].layer_scalar)
            keep = self.config.sliding_window - 1 if attn.sliding else k.shape[2]
            keys.append(k[:, :, -keep:] if keep else k[:, :, :0])
            values.append(v[:, :, -keep:] if keep else v[:, :, :0])
        padded = (cache.padded if cache is not None else False) or \
            (attention_mask is not None and not bool(mask.all()))
        return EncoderCache(keys, values, full_mask, start + n, padded)

    @torch.no_grad()
    def denoise(self, canvas: Tensor, cache: EncoderCache, sc_logits: Tensor | None = None) -> Tensor:
        """(B, C) canvas -> (B, C, V) float32 logits: bidirectional over the cache's keys (read
        only) and the canvas, self-conditioned on the previous step's (B, C, V) logits."""
        dec = self.model.decoder
        x = self.embed(canvas)
        if sc_logits is None:
            soft = torch.zeros_like(x)
        else:
            weight = dec.embed_tokens.weight
            scale = torch.tensor(math.sqrt(self.config.hidden_size)).to(weight.dtype).to(x.dtype)
            soft = torch.matmul(sc_logits.softmax(-1, dtype=torch.float32).to(weight.dtype), weight) * scale
        sc = dec.self_conditioning
        h = gemma_rms_norm(x + sc(sc.pre_norm(soft)), None, self.config.rms_norm_eps)
        b, c = canvas.shape
        positions = torch.arange(cache.seen, cache.seen + c, device=canvas.device)
        real = torch.ones(b, c, dtype=torch.bool, device=canvas.device)   # no padding: no mask,
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attn
            cos, sin = self.rope(i, positions, h.dtype)
            q, k, v = attn.project(layer.input_layernorm(h), cos, sin)
            k = torch.cat([cache.keys[i], k], 2)
            v = torch.cat([cache.values[i], v], 2)
            mask = torch.cat([cache.layer_mask(i), real], 1)[:, None, None, :] if cache.padded else None
            h = h + layer.post_attention_layernorm(attn.attend(q, k, v, mask))
            h = layer.feed_forward(h, layer.layer_scalar)
        return self.logits(h)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        raise TypeError("DiffusionGemma has no single forward: call encode(...) then denoise(...)")


def set_moe_impl(model: nn.Module, impl: str) -> nn.Module:
    """Run every `GemmaExperts` of `model` as `impl` (one of `MOE_IMPLS`); returns `model`."""
    if impl not in MOE_IMPLS:
        raise ValueError(f"moe_impl {impl!r} is not supported; accepted: {list(MOE_IMPLS)}")
    for module in model.modules():
        if isinstance(module, GemmaExperts):
            module.moe_impl = impl
    return model


def config_fields() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(DiffusionGemmaConfig))


GENERATION_KEYS = ("max_denoising_steps", "t_min", "t_max", "stability_threshold",
                   "confidence_threshold", "sampler_config", "eos_token_id", "pad_token_id",
                   "max_new_tokens")
"""The `generation_config.json` fields the family's default decoding reads."""


def read_generation_config(directory: Any) -> dict[str, Any]:
    """The checkpoint's `generation_config.json` fields in `GENERATION_KEYS` that are set (not
    null); {} when there is no such file. Raises ValueError for a file that is not a JSON object."""
    import json
    from pathlib import Path

    path = Path(directory) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({first_line_of(err)})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return {k: raw[k] for k in GENERATION_KEYS if raw.get(k) is not None}


def first_line_of(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def build(directory: Any, config: dict[str, Any]) -> DiffusionGemmaModel:
    """The loader's builder: config, weights (by the tie map), and the generation defaults.

    Raises:
        ModelLoadError: a config this port does not implement, or weights that do not match.
    """
    from dllm_decode.models.checkpoint import (ModelLoadError, check_memory, load_state_strict,
                                               read_safetensors)

    try:
        parsed = DiffusionGemmaConfig.from_dict(config)
        generation = read_generation_config(directory)
    except (ValueError, TypeError) as err:
        raise ModelLoadError(f"{directory / 'config.json'}: {first_line_of(err)}") from None
    check_memory(directory / "config.json", config.get("text_config") or {}, bytes_per_parameter=2)
    with torch.device("meta"):
        model = DiffusionGemmaModel(parsed)
    try:
        state = model.load_reference_state(read_safetensors(directory))
    except ValueError as err:
        raise ModelLoadError(f"{directory}: {first_line_of(err)}") from None
    load_state_strict(model, state, directory, assign=True)
    model.generation_defaults = generation
    eos = generation.get("eos_token_id")
    if eos is not None:            # the reference stops only at the generation config's EOS
        model.eos_token_ids = tuple(eos) if isinstance(eos, list) else (int(eos),)
    return model
