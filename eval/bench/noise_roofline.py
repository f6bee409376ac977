"""The floors of a uniform-noise decode (DiffusionGemma): what each encoder and decoder forward
must read and compute, on a device with datasheet peaks (`roofline`'s rules, this family's counts).

Per forward of a batch of B rows feeding `rows` tokens each (N = B x rows tokens):

* weights read: every block weight outside the routed experts (attention, dense MLP, router,
  norms), and in each layer the experts the N tokens choose. Under uniform routing (random
  weights route near-uniformly) a layer reads E (1 - (1 - k/E)^N) distinct experts in
  expectation: at the 26B-A4B's E = 128, k = 8 a 256-token canvas reads all but 1e-5 of them, so
  a decoder step reads the whole model, while a one-token step would read 8 of 128;
* a decoder step also reads the self-conditioning MLP, and the tied V x H embedding twice: as the
  head, and (every step but a canvas's first) for the soft embedding `softmax(z) @ E`;
* the K/V it attends: per layer (cached + fed) columns x K/V width x 2 (full layers keep every
  committed token, sliding layers the last W - 1); the gathered embedding rows;
* FLOPs: 2 x (active weights) x N, the head and the soft embedding 2 V H N each, and attention
  4 x (query width) x N x keys per layer.

`roofline.floor` sums a plan of these forwards as it sums the masked families' (each forward
answers `bytes` and `flops`). `plan` lists a decode's forwards: per canvas one encoder pass over its fresh tokens (the prompt,
then the previous canvas) and `steps` decoder passes over the canvas (random weights never pass
the stopping test, so every canvas runs all its steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dllm_decode.devices import DevicePeaks
from dllm_decode.eval.bench.roofline import floor


@dataclass(frozen=True)
class NoiseShape:
    """What the floors need of a DiffusionGemma model (parameters counted, not assumed)."""

    hidden: int
    vocab: int
    window: int
    sliding: tuple[bool, ...]
    q_widths: tuple[int, ...]
    kv_widths: tuple[int, ...]
    shared_params: int          # block weights outside the routed experts, and the final norm
    expert_params: int          # one expert's (gate, up, down)
    experts: int
    top_k: int
    sc_params: int              # the self-conditioning MLP and its norm
    bytes_per_param: int

    @property
    def layers(self) -> int:
        return len(self.sliding)

    @classmethod
    def of(cls, model: Any) -> NoiseShape:
        cfg = model.config
        dec = model.model.decoder
        total = sum(p.numel() for p in model.parameters())
        experts = sum(layer.experts.gate_up_proj.numel() + layer.experts.down_proj.numel()
                      for layer in dec.layers)
        sc = sum(p.numel() for p in dec.self_conditioning.parameters())
        embedding = dec.embed_tokens.weight.numel()
        heads = cfg.num_attention_heads
        return cls(cfg.hidden_size, cfg.vocab_size, cfg.sliding_window,
                   tuple(t == "sliding_attention" for t in cfg.layer_types),
                   tuple(heads * d for d in cfg.layer_head_dims),
                   tuple(kv * d for kv, d in zip(cfg.layer_kv_heads, cfg.layer_head_dims)),
                   total - experts - sc - embedding, experts // (cfg.num_experts * cfg.num_hidden_layers),
                   cfg.num_experts, cfg.top_k_experts, sc, dec.embed_tokens.weight.element_size())

    def experts_read(self, tokens: int) -> float:
        """Expected distinct experts a layer reads for `tokens` tokens under uniform routing."""
        return self.experts * (1 - (1 - self.top_k / self.experts) ** tokens)

    def kept(self, layer: int, committed: int) -> int:
        """Cached keys layer `layer` holds after `committed` tokens."""
        return min(committed, self.window - 1) if self.sliding[layer] else committed


@dataclass(frozen=True)
class NoiseForward:
    """One forward: an encoder pass (`decoder` False) or a decoder step over `rows` tokens per
    row with `committed` tokens already cached; `soft` whether it self-conditions."""

    decoder: bool
    rows: int
    committed: int
    soft: bool = False

    def _keys(self, shape: NoiseShape, layer: int) -> int:
        return shape.kept(layer, self.committed) + self.rows

    def bytes(self, shape: NoiseShape, batch: int) -> float:
        tokens = batch * self.rows
        weights = shape.shared_params + shape.layers * shape.experts_read(tokens) * shape.expert_params
        if self.decoder:
            weights += shape.sc_params + shape.vocab * shape.hidden * (2 if self.soft else 1)
        kv = sum(2 * w * self._keys(shape, i) * batch for i, w in enumerate(shape.kv_widths))
        return (weights + kv + tokens * shape.hidden) * shape.bytes_per_param

    def flops(self, shape: NoiseShape, batch: int) -> float:
        tokens = batch * self.rows
        active = shape.shared_params + shape.layers * shape.top_k * shape.expert_params
        flops = 2 * active * tokens
        if self.decoder:
            flops += 2 * (shape.sc_params + shape.vocab * shape.hidden * (2 if self.soft else 1)) * tokens
        return flops + sum(4 * w * tokens * self._keys(shape, i) for i, w in enumerate(shape.q_widths))


def plan(prompt_length: int, gen_length: int, canvas: int, steps: int) -> list[NoiseForward]:
    """The forwards of one decode of `gen_length / canvas` canvases of `steps` steps each."""
    forwards, committed = [], 0
    for index in range(gen_length // canvas):
        fresh = prompt_length if index == 0 else canvas
        forwards.append(NoiseForward(False, fresh, committed))
        committed += fresh
        forwards += [NoiseForward(True, canvas, committed, soft=step > 0) for step in range(steps)]
    return forwards


def step_floors(shape: NoiseShape, committed: int, canvas: int, batch: int,
                peaks: DevicePeaks | None, dtype: str) -> dict[str, float] | None:
    """One self-conditioned decoder step's bytes and its read and compute floors in ms (None
    without datasheet peaks)."""
    step = NoiseForward(True, canvas, committed, soft=True)
    bound = floor(shape, [step], batch, peaks, dtype)
    if bound is None:
        return None
    return {"bytes": step.bytes(shape, batch), "read_floor_ms": 1000 * bound.read_seconds,
            "compute_floor_ms": 1000 * bound.compute_seconds}
