"""How fast a decode could be on a device: its forwards' weight-read and compute floors.

A forward must read every weight it multiplies (the blocks and the head; the embedding only for
the rows it gathers) and the K/V it attends, and must do its multiply-adds. On a device with
bandwidth `bw` and dense peak `F` it cannot finish sooner than `bytes / bw` (the weight-read
floor) nor sooner than `FLOPs / F` (the compute floor); the roofline is the larger of the two.
Below the ridge point (`F / bw` rows per forward, about 295 on an H100 SXM) a forward is
bound by reading its weights, whatever the number of rows; above it, by its FLOPs.

Counts, per forward of a batch of `B` canvases, each feeding `rows_fed` rows, returning logits
for `rows_out` rows and attending `keys` columns:

* bytes = (P_blocks + P_head) x bytes per parameter + embedding rows gathered
  (B x rows_fed x width) + K/V read (2 x layers x kv_width x keys x B), all at the weights' dtype;
* FLOPs = 2 P_blocks B rows_fed + 2 P_head B rows_out + 4 layers width B rows_fed keys
  (QK^T and AV).

`forward_plan` lists the forwards one decode makes under a cache at a fixed number of steps per
block (what `bench shaped` runs), so a measured decode compares with the sum of its forwards'
floors. Peaks are datasheet figures (`dllm_decode.devices.DEVICE_PEAKS`): the floor is a bound
no device reaches, and a device not listed has no floor (never a guessed one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dllm_decode.devices import DevicePeaks

UNKNOWN_DEVICE = "unknown device"
"""What a floor column says for a device without datasheet peaks."""


@dataclass(frozen=True)
class ModelShape:
    """What the floors need of a model: depth, attention widths and parameter counts.

    Attributes:
        layers: transformer blocks.
        width: query width (heads x head dim), the attention's FLOPs per key.
        kv_width: key/value width (K/V heads x head dim) per layer, for the K/V bytes read.
        block_params: parameters inside the blocks (and the final norm).
        head_params: the output head's parameters (read in full every forward).
        embedding_params: the input embedding's (only the gathered rows are read).
        bytes_per_param: 2 for bf16/fp16, 4 for fp32.
    """

    layers: int
    width: int
    kv_width: int
    block_params: int
    head_params: int
    embedding_params: int
    bytes_per_param: int

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights every forward reads: blocks and head."""
        return (self.block_params + self.head_params) * self.bytes_per_param

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        """The shape of a LLaDA-style (`n_layers`, `d_model`, `n_heads`, `n_kv_heads`) or
        transformers-style (`num_hidden_layers`, `hidden_size`, ...) model, its parameters counted.

        Raises:
            ValueError: a model whose config names neither set of fields.
        """
        config = getattr(model, "config", None)
        layers = _field(config, "n_layers", "num_hidden_layers")
        d_model = _field(config, "d_model", "hidden_size")
        heads = _field(config, "n_heads", "num_attention_heads")
        if None in (layers, d_model, heads):
            raise ValueError(f"cannot read a model shape from {type(model).__name__}: its config "
                             f"names neither n_layers/d_model/n_heads nor num_hidden_layers/hidden_size/"
                             f"num_attention_heads")
        head_dim = getattr(config, "head_dim", None) or d_model // heads
        kv_heads = _field(config, "n_kv_heads", "num_key_value_heads") or heads
        vocab = _field(config, "embedding_size", "vocab_size") or getattr(config, "vocab_size")
        embedding = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
        params = list({id(p): p for p in model.parameters()}.values())   # tied weights once
        embedding_params = sum(p.numel() for p in params if id(p) in embedding)
        heads_found = [p for p in params if id(p) not in embedding and p.dim() == 2 and p.shape[0] >= vocab]
        head_params = sum(p.numel() for p in heads_found) or embedding_params     # tied: the embedding
        block_params = sum(p.numel() for p in params) - embedding_params - sum(p.numel() for p in heads_found)
        dtype = next((p.dtype for p in params if p.dim() > 1), torch.float32)
        return cls(layers, heads * head_dim, kv_heads * head_dim, block_params, head_params,
                   embedding_params, torch.empty((), dtype=dtype).element_size())


def _field(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class Forward:
    """One forward of one canvas: rows fed, logits rows returned, key columns attended."""

    rows_fed: int
    rows_out: int
    keys: int

    def bytes(self, shape: ModelShape, batch: int) -> float:
        kv = 2 * shape.layers * shape.kv_width * self.keys * batch
        gathered = batch * self.rows_fed * shape.width
        return shape.weight_bytes + (kv + gathered) * shape.bytes_per_param

    def flops(self, shape: ModelShape, batch: int) -> float:
        return batch * (2 * shape.block_params * self.rows_fed + 2 * shape.head_params * self.rows_out
                        + 4 * shape.layers * shape.width * self.rows_fed * self.keys)


@dataclass(frozen=True)
class Floor:
    """A run's floors in seconds: weight (and K/V) read, compute, and the roofline (the larger)
    summed over its forwards; `forwards` of them."""

    read_seconds: float
    compute_seconds: float
    seconds: float
    forwards: int

    @property
    def ms_per_forward(self) -> float:
        return 1000 * self.seconds / max(self.forwards, 1)


def floor(shape: ModelShape, plan: Sequence[Forward], batch: int, peaks: DevicePeaks | None,
          dtype: str) -> Floor | None:
    """The floors of running `plan`'s forwards at `batch` on a device with `peaks` (None: a
    device without datasheet peaks, or a dtype it lists no peak for). Any forward that answers
    `bytes(shape, batch)` and `flops(shape, batch)` fits (`noise_roofline`'s, with its shape)."""
    peak = peaks.flops_for(dtype) if peaks is not None else None
    if peaks is None or not peak:
        return None
    read = [f.bytes(shape, batch) / peaks.hbm_bytes_per_s for f in plan]
    compute = [f.flops(shape, batch) / peak for f in plan]
    return Floor(sum(read), sum(compute), sum(max(r, c) for r, c in zip(read, compute)), len(plan))


def forward_plan(cache: str, prompt_length: int, gen_length: int, block_length: int,
                 steps_per_block: int) -> list[Forward]:
    """The forwards of one decode at `steps_per_block` forwards per block (a fixed-count policy):

    * `none`: every step feeds the whole canvas, logits from the block start on;
    * `prefix`: a full refresh at each block's start, then the block and the suffix;
    * `dual`: a full refresh at each block's start, then the block only (all keys attended);
    * `block` (block-causal models): blocks lie on the model's grid (multiples of the block
      length; the prompt's last block is the first decoded); a block's first step feeds the
      finished block too (whose K/V it rewrites), the very first feeds the whole canvas up to the
      block's end; later steps feed the block; keys reach the block's end.

    Raises:
        ValueError: another cache name.
    """
    total = prompt_length + gen_length
    plan: list[Forward] = []
    if cache == "block":
        first = prompt_length // block_length * block_length
        for lo in range(first, total, block_length):
            hi = lo + block_length
            for step in range(steps_per_block):
                if step:
                    plan.append(Forward(block_length, block_length, hi))
                elif lo == first:
                    plan.append(Forward(hi, block_length, hi))
                else:
                    plan.append(Forward(2 * block_length, 2 * block_length, hi))
        return plan
    for start in range(prompt_length, total, block_length):
        for step in range(steps_per_block):
            if cache == "none":
                plan.append(Forward(total, total - start, total))
            elif cache in ("prefix", "dual"):
                if step == 0:
                    plan.append(Forward(total, total - start if cache == "prefix" else block_length, total))
                else:
                    fed = total - start if cache == "prefix" else block_length
                    plan.append(Forward(fed, fed, total))
            else:
                raise ValueError(f"no forward plan for cache {cache!r}; known: none, prefix, dual, block")
    return plan
