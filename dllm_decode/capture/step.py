"""The captured step: the model forward over a padded window of canvas columns
(`captured_forward`), and the whole step (`captured_step`: that forward, then the eager step's
own decision functions), written with static shapes and no host sync, so that
`torch.compile(fullgraph=True, dynamic=False)` traces either as one graph and a CUDA graph can
replay it. Nothing here is a second copy of the step: features plug in through the step's
records and the executors, never as copies.

One function serves every cache: a step feeds canvas columns `fed` (a (W,) device index; a full
forward feeds every column, a cached step the block and its look-back), writes their K/V into the
static store by index, attends over the whole canvas under the key mask (bidirectional models:
the attended columns; block-causal models: attended columns of the same or an earlier block, in
positions) and returns the logits of the fed rows `out`. Padding columns of the window point at
the scratch column, whose K/V land where no query looks. The blocks run as the compact runtime's
fused blocks (`models.compact.CompactStack`), resolved on the host before each call: its lock,
weight fingerprint and rebuild stay outside the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from dllm_decode.models.compact import CompactStack, FusedBlock
from dllm_decode.models.layers import StaticKVCache, sdpa
from dllm_decode.records import Outcome
from dllm_decode.step import Resolved, Window, decide, resolve


@dataclass(frozen=True)
class Head:
    """What a model family adds around the blocks, as the family's own modules: its embedding,
    final norm and head (`project`: final-norm hidden states -> float32 logits, the family's
    `head` method; `vocab` its width), token shift (1: the network's row i predicts i + 1, Dream and Fast-dLLM v2)
    and block-causal block size (None: bidirectional).

    Modules, never their raw weights: a module a parallel plan or quantization swapped in (a
    vocabulary-parallel embedding or head and its collectives) runs under capture exactly as it
    runs eagerly."""

    embed: nn.Module
    norm: nn.Module
    project: Callable[[Tensor], Tensor]
    shift: int
    block_size: int | None
    device: torch.device
    vocab: int

    @classmethod
    def of(cls, model: Any) -> "Head":
        """The head of a LLaDA-layout or transformers-decoder-layout model.

        Raises:
            TypeError: a model of another family.
        """
        from dllm_decode.models.decoder import DecoderLM
        from dllm_decode.models.llada import LLaDAModelLM

        grid = getattr(model, "block_size", None)
        embed, _ = model.parts()
        device = embed.weight.device
        if isinstance(model, LLaDAModelLM):
            return cls(embed, model.model.transformer["ln_f"], model.head, 0, grid, device,
                       model.vocab_size)
        if isinstance(model, DecoderLM):
            return cls(embed, model.model.norm, model.head, int(model.token_shift), grid, device,
                       model.vocab_size)
        raise TypeError(f"{type(model).__name__} has no captured step (LLaDA and the "
                        f"transformers-decoder families have)")


def key_mask(attention: Tensor, positions: Tensor, fed: Tensor, block_size: int | None) -> Tensor:
    """Bool SDPA mask over the (B, L + 1) canvas: (B, 1, 1, L + 1) attended keys, or for a
    block-causal model (B, 1, W, L + 1): key k for fed query q iff block(k) <= block(q) in
    positions (`layers.block_causal_mask`), k attended."""
    keys = attention.bool()
    if block_size is None:
        return keys[:, None, None, :]
    blocks = torch.div(positions, block_size, rounding_mode="floor")
    allowed = blocks[:, None, :] <= blocks.index_select(1, fed)[:, :, None]
    return (allowed & keys[:, None, :])[:, None]


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The bool SDPA mask as the additive one SDPA would make of it in every layer (0 where
    attended, -inf elsewhere), made once per forward, in storage whose rows are padded to 16
    columns so the memory-efficient kernel's alignment needs no per-layer copy either."""
    width = mask.shape[-1]
    padded = torch.zeros((*mask.shape[:-1], -(-width // 16) * 16), dtype=dtype, device=mask.device)
    padded[..., :width].masked_fill_(~mask, float("-inf"))
    return padded[..., :width]


def block_step(block: FusedBlock, h: Tensor, cos: Tensor, sin: Tensor, full_precision: bool,
               mask: Tensor, keys: Tensor, values: Tensor, fed: Tensor, keep: Tensor) -> Tensor:
    """One transformer block over the fed rows `h` (B, W, d): its K/V written into this layer's
    static store `keys`, `values` (B, Hkv, L + 1, D) at columns `fed` (except where `keep`),
    attention over the whole canvas under `mask`. The same code for every layer (the layer's tensors are arguments), so
    `regional` capture compiles it once and reuses it for every layer."""
    q, k, v = block.attention_inputs(h, cos, sin, full_precision)
    k, v = StaticKVCache(keys[None], values[None]).update(0, k, v, fed, keep)
    o = sdpa(q, k, v, mask)
    return block.finish(h, o)


def captured_forward(stack: CompactStack, head: Head, cos_table: Tensor, sin_table: Tensor,
                     canvas: Tensor, attention: Tensor, keys: Tensor, values: Tensor, fed: Tensor,
                     out: Tensor, prev: Tensor, keep: Tensor,
                     block_fn: Callable[..., Tensor] = block_step) -> Tensor:
    """(B, O, V) float32 logits of fed rows `out` after feeding canvas columns `fed`.

    Args:
        stack: the model's compact stack (resolved on the host).
        head: the family's embedding, norm and head.
        cos_table, sin_table: the stack's rotary tables, reserved beyond every position.
        canvas, attention: (B, L + 1) static buffers.
        keys, values: the (layers, B, Hkv, L + 1, D) static K/V store, written at `fed`.
        fed: (W,) canvas columns to compute (padding: the scratch column L).
        out: (O,) rows of `fed` whose logits are returned.
        prev: (O,) the fed row holding each returned row's predecessor (token-shifted models:
            row i reads row i - 1, except at position 0, which keeps its own).
        keep: (B, W) bool, the fed columns whose stored K/V each row keeps (outside its own
            window: `dllm_decode.row_windows`); all False when every row has the same window.
        block_fn: runs one block (`block_step`, or its compiled form under `regional`).
    """
    positions = (attention.cumsum(-1) - 1).clamp_min(0)
    fed_positions = positions.index_select(1, fed)
    batch, width = fed_positions.shape
    flat = fed_positions.reshape(-1)
    shape = (batch, width, 1, cos_table.shape[1])
    cos = cos_table.index_select(0, flat).view(shape)
    sin = sin_table.index_select(0, flat).view(shape)
    h = head.embed(canvas.index_select(1, fed))
    mask = additive(key_mask(attention, positions, fed, head.block_size), h.dtype)   # once, not per layer
    for layer, block in enumerate(stack.blocks):
        h = block_fn(block, h, cos, sin, stack.full_precision, mask, keys[layer], values[layer], fed, keep)
    h = head.norm(h)
    own = h.index_select(1, out)
    if head.shift:
        starts = (fed_positions.index_select(1, out) == 0).unsqueeze(-1)
        own = torch.where(starts, own, h.index_select(1, prev))
    return head.project(own)


class Rule(NamedTuple):
    """What `step.decide` reads of a `DecodeConfig`, for a whole step with no filters."""

    scheduler: Any
    temperature: float
    filters: tuple = ()


def captured_step(stack: CompactStack, head: Head, cos_table: Tensor, sin_table: Tensor,
                  canvas: Tensor, attention: Tensor, keys: Tensor, values: Tensor, fed: Tensor,
                  out: Tensor, prev: Tensor, keep: Tensor, block: Tensor, gen_span: Tensor, region_start: Tensor,
                  step: Tensor, num_steps: Tensor, uniform: Tensor | None, scheduler: Any,
                  temperature: float, mask_id: int, eos_ids: tuple[int, ...],
                  block_fn: Callable[..., Tensor] = block_step) -> tuple[Resolved, Tensor, Tensor, Tensor, Tensor]:
    """The whole step in one graph: `captured_forward`, then the eager step's own functions
    (`step.decide`, `step.resolve`, `Outcome.of`) on the window of returned rows `out`.

    Args (beyond `captured_forward`'s): `block`, `gen_span` (B, 2) and `region_start` (B,) the
    rows' bounds; `step`, `num_steps` 0-d long; `uniform` the sampling draws made on the host
    (`ops.aligned_uniform`, NaN: none) or None at temperature 0; `scheduler` a rule that keeps
    the default hooks and `temperature` (`dispatch.fused_problem`: no filters, no trace).
    Returns the `Outcome`'s tensors: resolved, worked, edited, generation end, nonfinite.
    """
    logits = captured_forward(stack, head, cos_table, sin_table, canvas, attention, keys, values,
                              fed, out, prev, keep, block_fn)
    columns = fed.index_select(0, out)                  # canvas column of each window column
    window = Window(columns[0], logits, canvas.index_select(1, columns), block, gen_span, region_start)
    inp, decision, nonfinite, _ = decide(Rule(scheduler, temperature), None, window, step=step, num_steps=num_steps, span=0,
                                         generator=None, eos_ids=eos_ids, mask_id=mask_id,
                                         rebound=None, uniform=uniform)
    o = Outcome.of(inp, decision, resolve(inp, decision), nonfinite, torch.zeros_like(inp.live))
    return o.resolved, o.worked, o.edited, o.gen_end, o.nonfinite
