"""The captured decoder forward of a uniform-noise family (DiffusionGemma): `model.denoise` on
static, bucketed shapes, so that it compiles with `torch.compile(fullgraph=True, dynamic=False)`
and replays as a CUDA graph (`GraphCache` modes).

`CapturedDenoise.denoise(canvas, cache, sc_logits)` is a drop-in for `model.denoise` (same
arguments, same logits within float rounding): the canvas (B, C), the previous step's logits for
self-conditioning and the encoder cache go into per-bucket static buffers, and the family's own
`decode` (the pass `denoise` runs eagerly: its modules, never raw weights, so tensor parallelism
and low-precision layers work here too) runs on them. Buckets: the batch padded to a power of two
(padding rows attend their own canvas only), each layer's cached keys padded to a multiple of
`length_step` (padding columns masked), self-conditioning switched per call by a (B, 1, 1)
flag rather than a branch, so one graph serves a canvas's first step and the rest. The cache is
copied into the buffers once per canvas (the decoder reads it, never writes it); the canvas, the
rope tables and the previous logits every step.

Requires the experts' `static` form (`set_moe_impl(model, "static")`): the `loop` form syncs the
host once per layer to find its experts (`denoise_problem` says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.capture.buckets import Buckets
from dllm_decode.capture.graphs import GraphCache


def captured_decode(model: Any, canvas: Tensor, sc_logits: Tensor, use_sc: Tensor, cos: list[Tensor],
                    sin: list[Tensor], keys: list[Tensor], values: list[Tensor], masks: list[Tensor]) -> Tensor:
    """The family's decoder pass on a bucket's buffers (the function each bucket compiles)."""
    return model.decode(canvas, sc_logits, use_sc, list(zip(cos, sin)), keys, values, masks)


def denoise_problem(model: Any) -> str | None:
    """Why `model`'s decoder forward cannot run captured (a phrase), or None."""
    if not callable(getattr(model, "decode", None)) or getattr(model, "canvas_kind", "mask") != "noise":
        return f"{type(model).__name__} has no uniform-noise decoder pass"
    impls = {getattr(m, "moe_impl", None) for m in model.modules()} - {None}
    if "loop" in impls:
        return ("the experts run their `loop` form, which syncs the host per layer; "
                "set_moe_impl(model, 'static') first")
    return None


@dataclass
class _Buffers:
    """One bucket's static inputs (a recorded graph reads these addresses)."""

    canvas: Tensor
    sc_logits: Tensor
    use_sc: Tensor
    cos: list[Tensor]
    sin: list[Tensor]
    keys: list[Tensor]
    values: list[Tensor]
    masks: list[Tensor]
    cache: Any = None                 # (encoder cache, its length) copied in; reloaded when either changes

    def args(self, model: Any) -> tuple:
        return (model, self.canvas, self.sc_logits, self.use_sc, self.cos, self.sin, self.keys,
                self.values, self.masks)


class CapturedDenoise:
    """`model.denoise` through `graphs` (one callable per bucket: `static`, `compile` or
    `cuda-graphs`, as `GraphCache` runs them).

    Raises:
        ValueError: a model whose decoder forward cannot be captured (`denoise_problem`), or the
            `regional` mode (it compiles one block of the masked families' compact stack).
    """

    def __init__(self, model: Any, graphs: GraphCache):
        if graphs.mode == "regional":
            raise ValueError("capture 'regional' compiles one block of the compact stack; the noise "
                             "decoder runs 'static', 'compile' or 'cuda-graphs'")
        if (problem := denoise_problem(model)) is not None:
            raise ValueError(f"capture {graphs.mode!r} cannot run this decoder: {problem}")
        self.model, self.graphs = model, graphs
        self.buckets = Buckets(max_batch=graphs.max_batch, length_step=graphs.length_step)

    @torch.no_grad()
    def denoise(self, canvas: Tensor, cache: Any, sc_logits: Tensor | None = None) -> Tensor:
        """(B, C) canvas -> (B, C, V) float32 logits, as `model.denoise`."""
        model, (b, c) = self.model, canvas.shape
        lengths = tuple(self.buckets.length(k.shape[2]) for k in cache.keys)
        key = ("denoise", self.buckets.batch(b), c, lengths)
        buffers = self._buffers(key, canvas, cache, sc_logits)
        if buffers.cache is None or buffers.cache[0] is not cache or buffers.cache[1] != cache.seen:
            self._load_cache(buffers, cache, b)
        buffers.canvas.fill_(0)
        buffers.canvas[:b].copy_(canvas)
        buffers.use_sc.fill_(sc_logits is not None)
        if sc_logits is not None:
            buffers.sc_logits[:b].copy_(sc_logits)
        positions = torch.arange(cache.seen, cache.seen + c, device=canvas.device)
        for i in range(len(buffers.cos)):
            cos, sin = model.rope(i, positions, buffers.cos[i].dtype)
            buffers.cos[i].copy_(cos)
            buffers.sin[i].copy_(sin)
        logits = self.graphs.run(key, (model,), buffers.args(model), fn=captured_decode)[:b]
        return logits.clone() if self.graphs.mode == "cuda-graphs" else logits

    def _buffers(self, key: tuple, canvas: Tensor, cache: Any, sc_logits: Tensor | None) -> _Buffers:
        if key in self.graphs.buffers:
            return self.graphs.buffers[key]
        model, (_, bb, c, lengths) = self.model, key
        dev, dtype = canvas.device, model.model.decoder.embed_tokens.weight.dtype
        dims = [k.shape[3] for k in cache.keys]
        heads = [k.shape[1] for k in cache.keys]
        buffers = _Buffers(
            canvas=torch.zeros(bb, c, dtype=torch.long, device=dev),
            sc_logits=torch.zeros(bb, c, model.vocab_size, dtype=torch.float32, device=dev),
            use_sc=torch.zeros(bb, 1, 1, dtype=torch.bool, device=dev),
            cos=[torch.zeros(1, c, 1, d, dtype=dtype, device=dev) for d in dims],
            sin=[torch.zeros(1, c, 1, d, dtype=dtype, device=dev) for d in dims],
            keys=[torch.zeros(bb, h, s, d, dtype=cache.keys[0].dtype, device=dev)
                  for h, s, d in zip(heads, lengths, dims)],
            values=[torch.zeros(bb, h, s, d, dtype=cache.keys[0].dtype, device=dev)
                    for h, s, d in zip(heads, lengths, dims)],
            masks=[torch.zeros(bb, 1, 1, s + c, dtype=torch.bool, device=dev) for s in lengths])
        self.graphs.buffers[key] = buffers
        return buffers

    @staticmethod
    def _load_cache(buffers: _Buffers, cache: Any, b: int) -> None:
        """Copy the encoder's K/V in (padding columns zero and masked off; padding rows see only
        their own canvas)."""
        for i in range(len(cache.keys)):
            k, v = cache.layer(i)                 # dequantized from a low-precision store
            s = k.shape[2]
            buffers.keys[i].zero_()
            buffers.values[i].zero_()
            buffers.keys[i][:b, :, :s].copy_(k)
            buffers.values[i][:b, :, :s].copy_(v)
            mask = buffers.masks[i]
            mask.fill_(False)
            mask[..., mask.shape[-1] - buffers.canvas.shape[1]:] = True
            mask[:b, 0, 0, :s] = cache.layer_mask(i)
        buffers.cache = (cache, cache.seen)

