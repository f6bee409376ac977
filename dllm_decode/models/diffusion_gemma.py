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
`kv_cache_dtype` fp8 / int8 (`dllm_decode.quant.kv`) keeps the encoder cache as codes with a
float32 scale per head per column; a chunk being encoded attends its own fresh K/V in float and
the earlier chunks as stored, and every decoder pass reads the stored cache dequantized.
Images: refused (`check_text_only`); the vision tower's weights are not loaded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from dllm_decode.models.gemma_config import DiffusionGemmaConfig
from dllm_decode.models.gemma_layers import (GemmaEmbedding, GemmaLayer, GemmaRMSNorm, SelfConditioning,
                                             gemma_rms_norm, inv_frequencies, set_moe_impl)

__all__ = ["DiffusionGemmaConfig", "DiffusionGemmaModel", "EncoderCache", "build", "set_moe_impl"]


@dataclass
class EncoderCache:
    """The encoder's K/V of every committed token, per layer (B, Hkv, S, D): full layers keep
    all, sliding layers the last W-1 (chronological). `mask` (B, T) bool marks the real
    (non-padding) columns of all T tokens encoded so far; `seen` is T; `padded` whether any
    column is padding (without, attention runs unmasked, as the reference's does). `store`:
    None keeps float tensors; the model's low-precision store (`kv_cache_dtype` fp8 / int8,
    `dllm_decode.quant.kv`) keeps codes and scales, dequantized one layer at a time when read."""

    keys: list[Any]
    values: list[Any]
    mask: Tensor
    seen: int
    padded: bool = True
    store: Any = None

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """Layer `i`'s (keys, values) as attention reads them."""
        k, v = self.keys[i], self.values[i]
        return (k, v) if self.store is None else (self.store.read(k), self.store.read(v))

    def read_keys(self) -> Sequence[Tensor]:
        return self.keys if self.store is None else _Dequantized(self.store, self.keys)

    def read_values(self) -> Sequence[Tensor]:
        return self.values if self.store is None else _Dequantized(self.store, self.values)

    def layer_mask(self, layer: int) -> Tensor:
        """(B, S) real-column mask of the keys layer `layer` keeps."""
        return self.mask[:, self.mask.shape[1] - self.keys[layer].shape[2]:]

    def select_rows(self, rows: Tensor) -> "EncoderCache":
        pick = lambda t: t.index_select(0, rows.to(t.device))   # noqa: E731
        if self.store is not None:
            kv = lambda t: self.store.select(t, rows.to(t.codes.device))   # noqa: E731
            return EncoderCache([kv(k) for k in self.keys], [kv(v) for v in self.values],
                                pick(self.mask), self.seen, self.padded, self.store)
        return EncoderCache([pick(k) for k in self.keys], [pick(v) for v in self.values],
                            pick(self.mask), self.seen, self.padded)

    @property
    def nbytes(self) -> int:
        """Bytes the stored K/V take (codes and scales of a low-precision store)."""
        return sum(t.nbytes for t in (*self.keys, *self.values))


class _Dequantized(Sequence):
    """Stored layers read on indexing, so the decoder pass holds one layer's float K/V at a time."""

    def __init__(self, store: Any, items: list[Any]):
        self.store, self.items = store, items

    def __getitem__(self, i: Any) -> Any:
        return self.store.read(self.items[i])

    def __len__(self) -> int:
        return len(self.items)


ENCODER = "model.encoder.language_model."


def tied_twin(name: str) -> str | None:
    """The decoder weight an encoder text weight is tied to (None for other names)."""
    if name.startswith(ENCODER) and not name.endswith("layer_scalar"):
        return "model.decoder." + name[len(ENCODER):]
    return None


def tied_slices(reader: Any) -> Any:
    """A sharded load's reader (`parallel.loading.CheckpointReader`) that also reads each slice's
    stored encoder copy and refuses one that differs, as the whole load does.

    Raises:
        ModelLoadError: an encoder weight that differs from the decoder weight it is tied to.
    """
    from dllm_decode.models.checkpoint import ModelLoadError

    def read(name: str, part: Any, shape: tuple[int, ...]) -> Tensor:
        tensor = reader(name, part, shape)
        twin = ENCODER + name[len("model.decoder."):] if name.startswith("model.decoder.") else None
        if twin in reader.files and tied_twin(twin) == name and not torch.equal(reader(twin, part, shape), tensor):
            raise ModelLoadError(f"{reader.directory}: {twin} differs from the decoder weight it is tied "
                                 f"to; untied encoder weights are not supported")
        return tensor
    return read


def is_reference_copy(name: str) -> bool:
    """A checkpoint tensor this port does not hold: a tied copy (encoder text weights, `lm_head`)
    or the vision tower (text only)."""
    return tied_twin(name) is not None or name == "lm_head.weight" or name.startswith(
        ("model.encoder.vision_tower.", "model.encoder.embed_vision."))


class DiffusionGemmaModel(nn.Module):
    """The text model: `encode` fills an `EncoderCache`, `denoise` returns a canvas's logits.

    State-dict names are the reference's: the shared stack lives under `model.decoder.*`, the
    encoder's own per-layer `layer_scalar` under `model.encoder.language_model.layers.{i}.`.
    """

    canvas_kind: ClassVar[str] = "noise"     # an uncommitted column holds a random token, not [MASK]
    supports_kv = False                      # the masked loop's caches do not apply
    supports_kv_store = True                 # its encoder cache keeps K/V as `model.kv_store`
    # its causal encoder's K/V of a prompt prefix are exact to reuse across requests
    # (`dllm_decode.encoder_reuse`, the prefix cache)
    encoder_reuse: ClassVar[bool] = True
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
        dec.embed_tokens = GemmaEmbedding(cfg.vocab_size, cfg.hidden_size)
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
        for name, tensor in state.items():
            twin = tied_twin(name)
            if twin is not None:
                other = state.get(twin)
                if other is not None and not torch.equal(other, tensor):
                    raise ValueError(f"{name} differs from the decoder weight it is tied to; "
                                     f"untied encoder weights are not supported")
            if not is_reference_copy(name):
                out[name] = tensor
        return out

    # -- pieces --------------------------------------------------------------------------------

    def embed(self, ids: Tensor) -> Tensor:
        table = self.model.decoder.embed_tokens
        scale = torch.tensor(math.sqrt(self.config.hidden_size)).to(table.weight.dtype)
        return table(ids) * scale

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
        z = self.model.decoder.embed_tokens.head(self.model.decoder.norm(h)).float()
        return torch.tanh(z / cap) * cap

    def check_text_only(self, ids: Tensor) -> None:
        """Raise a one-line ValueError for a prompt with image tokens (text only here)."""
        if bool((ids == self.config.image_token_id).any()):
            raise ValueError(f"the prompt holds image tokens (id {self.config.image_token_id}); "
                             f"this DiffusionGemma port is text only")

    # -- the two passes ------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, ids: Tensor, attention_mask: Tensor | None = None,
               cache: EncoderCache | None = None, fresh: list[Any] | None = None) -> EncoderCache:
        """Causal pass over (B, L) `ids` after the cached tokens; returns the extended cache.
        `fresh`, when given, receives every layer's (keys, values) of the L new columns as the
        cache keeps them (codes under a low-precision store), sliding layers' included: what the
        cross-request prefix cache stores (`dllm_decode.encoder_reuse`)."""
        self.check_text_only(ids)
        b, n = ids.shape
        dev = ids.device
        mask = torch.ones(b, n, dtype=torch.bool, device=dev) if attention_mask is None else attention_mask.bool()
        store = getattr(self, "kv_store", None)          # None: float K/V (`kv_cache_dtype` auto)
        if cache is not None and cache.store != store:
            raise ValueError(f"the encoder cache keeps K/V as {cache.store}, the model as {store}: "
                             f"encode it again after set_kv_cache_dtype")
        start = 0 if cache is None else cache.seen
        full_mask = mask if cache is None else torch.cat([cache.mask, mask], 1)
        positions = torch.arange(start, start + n, device=dev)
        h = self.embed(ids)
        keys, values = [], []
        for i, layer in enumerate(self.model.decoder.layers):
            attn = layer.self_attn
            cos, sin = self.rope(i, positions, h.dtype)
            q, k, v = attn.project(layer.input_layernorm(h), cos, sin)
            if store is not None:            # keep codes; the fresh columns attend in float
                sk, sv = store.put(k), store.put(v)
                if fresh is not None:
                    fresh.append((sk, sv))
                if cache is not None:
                    old_k, old_v = cache.layer(i)
                    sk, sv = store.cat(cache.keys[i], sk), store.cat(cache.values[i], sv)
                    k, v = torch.cat([old_k, k], 2), torch.cat([old_v, v], 2)
            else:
                if fresh is not None:
                    fresh.append((k, v))
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
            if store is not None:
                keys.append(store.last(sk, min(keep, k.shape[2])))
                values.append(store.last(sv, min(keep, k.shape[2])))
                continue
            keys.append(k[:, :, -keep:] if keep else k[:, :, :0])
            values.append(v[:, :, -keep:] if keep else v[:, :, :0])
        padded = (cache.padded if cache is not None else False) or \
            (attention_mask is not None and not bool(mask.all()))
        return EncoderCache(keys, values, full_mask, start + n, padded, store)

    @torch.no_grad()
    def denoise(self, canvas: Tensor, cache: EncoderCache, sc_logits: Tensor | None = None) -> Tensor:
        """(B, C) canvas -> (B, C, V) float32 logits: bidirectional over the cache's keys (read
        only) and the canvas, self-conditioned on the previous step's (B, C, V) logits."""
        b, c = canvas.shape
        positions = torch.arange(cache.seen, cache.seen + c, device=canvas.device)
        dtype = self.model.decoder.embed_tokens.weight.dtype
        tables = [self.rope(i, positions, dtype) for i in range(len(self.model.decoder.layers))]
        real = torch.ones(b, c, dtype=torch.bool, device=canvas.device)   # no padding: no mask,
        masks = [torch.cat([cache.layer_mask(i), real], 1)[:, None, None, :] if cache.padded else None
                 for i in range(len(tables))]
        return self.decode(canvas, sc_logits, None, tables, cache.read_keys(), cache.read_values(), masks)

    def decode(self, canvas: Tensor, sc_logits: Tensor | None, use_sc: Tensor | None,
               tables: list[tuple[Tensor, Tensor]], keys: Sequence[Tensor], values: Sequence[Tensor],
               masks: list[Tensor | None]) -> Tensor:
        """The decoder pass on explicit tensors (`denoise` prepares them; the captured forward,
        `dllm_decode.capture.denoise`, passes its static buffers): per layer the rope `tables`
        (cos, sin), the cached `keys`/`values` and the (B, 1, 1, S + C) key `masks` (None: no
        padding). `use_sc` (B, 1, 1) bool, when given, keeps self-conditioning only on its rows
        (the others run as with no previous logits)."""
        dec = self.model.decoder
        x = self.embed(canvas)
        if sc_logits is None:
            soft = torch.zeros_like(x)
        else:
            table = dec.embed_tokens
            scale = torch.tensor(math.sqrt(self.config.hidden_size)).to(table.weight.dtype).to(x.dtype)
            soft = table.soft(sc_logits.softmax(-1, dtype=torch.float32).to(table.weight.dtype)) * scale
            if use_sc is not None:
                soft = torch.where(use_sc, soft, torch.zeros_like(soft))
        sc = dec.self_conditioning
        h = gemma_rms_norm(x + sc(sc.pre_norm(soft)), None, self.config.rms_norm_eps)
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attn
            cos, sin = tables[i]
            q, k, v = attn.project(layer.input_layernorm(h), cos, sin)
            k = torch.cat([keys[i], k], 2)
            v = torch.cat([values[i], v], 2)
            h = h + layer.post_attention_layernorm(attn.attend(q, k, v, masks[i]))
            h = layer.feed_forward(h, layer.layer_scalar)
        return self.logits(h)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        raise TypeError("DiffusionGemma has no single forward: call encode(...) then denoise(...)")


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


def build(directory: Any, config: dict[str, Any], groups: Any = None,
          dtype: torch.dtype | None = None) -> DiffusionGemmaModel:
    """The loader's builder: config, weights (by the tie map), and the generation defaults.
    With `groups` (tensor parallel), each rank reads only its slices (in `dtype`, default the
    checkpoint's) by the family's plan (`dllm_decode.parallel.diffusion_gemma`).

    Raises:
        ModelLoadError: a config this port does not implement, or weights that do not match.
        ParallelError: a TP size the model cannot be split into.
    """
    from dllm_decode.models.checkpoint import (ModelLoadError, check_memory, load_state_strict,
                                               read_safetensors, tensor_names)

    try:
        parsed = DiffusionGemmaConfig.from_dict(config)
        generation = read_generation_config(directory)
    except (ValueError, TypeError) as err:
        raise ModelLoadError(f"{directory / 'config.json'}: {first_line_of(err)}") from None
    check_memory(directory / "config.json", config.get("text_config") or {},
                 bytes_per_parameter=2 / (groups.tp if groups is not None else 1))
    with torch.device("meta"):
        model = DiffusionGemmaModel(parsed)
    if groups is not None:
        from dllm_decode.parallel.loading import load_sharded

        drop = tuple(name for name in tensor_names(directory) if is_reference_copy(name))
        load_sharded(model, directory, groups, dtype, drop, checked=tied_slices)
    else:
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
