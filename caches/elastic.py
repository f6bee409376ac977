"""Elastic-Cache (Nguyen-Tri et al., 2025, arXiv 2510.14973):
attention-aware drift test on the most-attended tokens, depth-aware refresh of the deeper layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.caches.layerwise import LayerState, Stack, check_model
from dllm_decode.interfaces import Cache, DiffusionLM
from dllm_decode.row_windows import RowWindows


@dataclass
class ElasticState:
    """The layer caches, per layer the tracked columns (B, T) and their attention rows when they
    were chosen (B, H, T, L), the earliest column the last step fed, (B,) the block start of
    each row's last working step, and the step's counts."""

    layers: LayerState
    tracked: list[Tensor]
    reference: list[Tensor]
    fed_from: int
    row_from: Tensor
    refreshed: Tensor
    recomputed: Tensor

    def select_rows(self, rows: Tensor) -> ElasticState:
        return ElasticState(self.layers.select_rows(rows), [t.index_select(0, rows) for t in self.tracked],
                            [t.index_select(0, rows) for t in self.reference], self.fed_from,
                            self.row_from.index_select(0, rows), self.refreshed.index_select(0, rows),
                            self.recomputed.index_select(0, rows))


@dataclass(frozen=True)
class ElasticCache(Cache):
    """Recompute the active block every step; refresh every column of the deeper layers only where
    the attention of a tracked token drifted.

    Each step feeds the columns from the previous step's block start to the active block's end
    (the tokens decoded last step and the block) through every layer against the cached K/V of
    the others, writing their fresh K/V and inputs. At each layer it also recomputes the attention
    of that layer's `track_num` tracked tokens (the committed columns the block's masked rows
    attended most when they were chosen) from their cached inputs; where its cosine similarity to
    the attention recorded then falls below `gamma` at layer l, every column of layers l.. is
    recomputed from the cached inputs of layer l (merged with the fresh rows). The first step of
    a decode is a full forward.

    Deviations from the reference (`yxu-dev/Elastic-Cache@1796317`, a copy):
      * the refresh starts at the drifted layer itself (the reference sets `start = l + 1` and so
        feeds layer l+1 the stale layer-l outputs of the other columns): a drift at layer 0 is
        then a full forward, and `gamma > 1` equals `none` exactly;
      * the window of decoded masks is the loop's active block (the reference slides a window of
        the first `window_length` masks); masks after the block keep the K/V of the last refresh,
        as its `block_caching=True`;
      * the drift cosine is over the key axis of each head's attention row, averaged over heads
        and tracked tokens (`drift="keys"`, the default); `drift="heads"` is the reference's form,
        over the head axis per key, averaged over the attended keys (a pitfall: it is far more
        sensitive, so it refreshes more);
      * per batch row: each row refreshes from its own first drifted layer, feeds from its own
        last block start to its own block end and tracks the tokens its own block attends; a
        row whose block is done waits untouched (batched == one by one); the deciding host sync (is there a drift at all, and from which layer) is one
        extra sync per step, the price of skipping work on the host;
      * `suffix_window` (off by default) drops the masks more than that many columns after the
        block from attention (Streaming-dLLM's window; the last canvas column is kept);
      * after the loop cuts the canvas (end-of-text truncation) the next step is a full forward;
      * rows that join a running batch make its next step a full forward for every row, which
        the running rows would not take alone, so a running batch takes no newcomer mid-run
        (`mid_run_joins`; the engine starts another running batch).

    Attributes:
        gamma: cosine similarity under which a layer counts as drifted (paper: 0.9). > 1 refreshes
            every layer every step (then the logits equal `none`'s); 0 never refreshes.
        track_num: tracked tokens per layer (paper: 1).
        suffix_window: None, or the masks after the block kept in attention.
        drift: "keys" or "heads": the axis of the drift cosine (above).
        depth_aware: refresh from the drifted layer (the paper). False: a drift anywhere
            refreshes every layer (a full forward); the refresh of deeper layers alone starts
            from cached inputs that are themselves stale, which the small embedded model does
            not tolerate (`eval/bench/cache.py` figures in the README).
    """

    capturable: ClassVar[bool] = False    # rows chosen from the data each step: always eager
    own_windows: ClassVar[bool] = True     # each row's block, fed range and tracked tokens its own
    mid_run_joins: ClassVar[bool] = False  # a join makes the next step a full forward for every row

    gamma: float = 0.9
    track_num: int = bounded(1, most=65536, scales="work")
    suffix_window: int | None = bounded(None, most=MAX_CANVAS, scales="memory")
    drift: str = "keys"
    depth_aware: bool = True

    def __post_init__(self) -> None:
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")
        if self.track_num < 1:
            raise ValueError(f"track_num must be >= 1, got {self.track_num}")
        if self.suffix_window is not None and self.suffix_window < 0:
            raise ValueError(f"suffix_window must be >= 0 or None, got {self.suffix_window}")
        if self.drift not in ("keys", "heads"):
            raise ValueError(f"drift must be 'keys' or 'heads', got {self.drift!r}")

    def init_state(self, model: DiffusionLM) -> None:
        check_model(model, "elastic")
        return None

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any,
               rows: RowWindows | None = None) -> tuple[Tensor, int, Any]:
        """`rows`: each row's own block. A row feeds, tracks and refreshes as it would alone (from
        the block start of its own last working step to its own block end); a row whose block
        is done waits with its state untouched."""
        stack, (s, e) = Stack(model), block
        batch, length = canvas.shape
        rows = rows or RowWindows((s,) * batch, (e,) * batch, (True,) * batch)
        positions, mask, masked = stack.inputs(canvas, attention_mask, e, self.suffix_window)
        columns = torch.arange(length, device=canvas.device)
        bounds = torch.tensor([rows.start, rows.end], device=canvas.device)
        own = masked & (columns >= bounds[0, :, None]) & (columns < bounds[1, :, None])
        chosen = lambda p, fed: self._track(stack, p, fed, s, e, own, masked, mask)   # noqa: E731
        if state is None:
            tracked, reference = [], []

            def on_layer(layer: int, p: Tensor) -> None:
                t = chosen(p[:, :, s:e], s)
                tracked.append(t)
                reference.append(p.gather(2, t[:, None, :, None].expand(-1, p.shape[1], -1, length)))

            h, layers = stack.full(canvas, positions, mask, on_layer)
            full = torch.full((batch,), stack.depth, dtype=torch.long, device=canvas.device)
            state = ElasticState(layers, tracked, reference, s, bounds[0], full, torch.full_like(full, length))
            return stack.head(h[:, s:]), s, state
        a = min(state.fed_from, s)                       # covers every row's own range below
        busy = torch.tensor(rows.busy, device=canvas.device)
        mine = torch.stack([torch.minimum(state.row_from, bounds[0]), bounds[1]], 1)   # (B, 2)
        keep = (columns < mine[:, :1]) | (columns >= mine[:, 1:]) | ~busy[:, None]     # outside own
        h, start = self._fed_rows(stack, state, canvas, positions, mask, (a, e), chosen, keep, busy)
        if not self.depth_aware:                         # any drift: every layer, from the inputs
            start = torch.where(start < stack.depth, 0, start)
        first = int(start.min())                         # the extra host sync: any refresh, from where
        if first < stack.depth:
            h = torch.where((start < stack.depth)[:, None, None],
                            self._refresh(stack, state, positions, mask, start, first, chosen)[:, a:e], h)
        state.fed_from, state.row_from = s, torch.where(busy, bounds[0], state.row_from)
        state.refreshed = stack.depth - start
        state.recomputed = torch.where(start < stack.depth, length, torch.where(busy, mine[:, 1] - mine[:, 0], 0))
        return stack.head(h[:, s - a:]), s, state

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        return state.select_rows(rows) if isinstance(state, ElasticState) else state

    def report(self, state: Any) -> dict[str, Tensor] | None:
        if not isinstance(state, ElasticState):
            return None
        return {"refreshed_layers": state.refreshed, "recomputed": state.recomputed}

    def trim(self, state: Any, width: int) -> Any:
        return None                                      # the next step is a full forward

    def _track(self, stack: Stack, p: Tensor, rows_from: int, s: int, e: int, own: Tensor,
               masked: Tensor, mask: Tensor) -> Tensor:
        """(B, T) committed columns most attended by the masked rows of each row's own block
        (`own`, (B, L)), given the (B, H, n, L) probabilities of the rows from canvas column
        `rows_from`; `[s, e)` covers every row's block."""
        rows = stack.head_mean(p[:, :, s - rows_from:e - rows_from])     # (B, e - s, L)
        weight = own[:, s:e].float()
        received = (rows * weight[..., None]).sum(1)                      # (B, L)
        received = received.masked_fill(masked | ~mask[:, 0, 0], -1.0)
        top = received.topk(min(self.track_num, received.shape[1]), dim=-1)
        # a row with fewer committed columns than track_num repeats its best one (not an arbitrary
        # masked or padding column, which would differ between a batch and the row alone)
        return torch.where(top.values >= 0, top.indices, top.indices[:, :1])

    def _fed_rows(self, stack: Stack, state: ElasticState, canvas: Tensor, positions: Tensor,
                  mask: Tensor, fed: tuple[int, int], chosen, keep: Tensor,
                  busy: Tensor) -> tuple[Tensor, Tensor]:
        """The cheap pass: columns `fed` through every layer (each row's columns `keep` (B, L)
        keep their cached inputs and K/V), the drift test per layer, new tracked tokens (rows
        not `busy` keep theirs and never refresh). Returns the last hidden states of the fed
        columns and (B,) the first layer to refresh."""
        a, e = fed
        layers, depth = state.layers, stack.depth
        rope = stack.rope(positions[:, a:e])
        h = stack.embed(canvas[:, a:e])
        start = torch.full((canvas.shape[0],), depth, dtype=torch.long, device=canvas.device)
        kept = keep[:, a:e]
        for layer in range(depth):
            layers.inputs[layer][:, a:e] = torch.where(kept[..., None], layers.inputs[layer][:, a:e], h)
            q, k, v = stack.project(layer, h, rope)
            layers.keys[layer][:, :, a:e] = torch.where(kept[:, None, :, None], layers.keys[layer][:, :, a:e], k)
            layers.values[layer][:, :, a:e] = torch.where(kept[:, None, :, None], layers.values[layer][:, :, a:e], v)
            p = stack.probs(layer, q, layers.keys[layer], mask)
            old, new = state.tracked[layer], chosen(p, a)
            both = self._attention(stack, layers, positions, mask, layer, torch.cat([old, new], 1))
            now, reference = both.split(old.shape[1], dim=2)      # one attention for both sets
            similarity = self._similarity(stack, now, state.reference[layer], mask)
            start = torch.where(busy & (similarity < self.gamma) & (start == depth), layer, start)
            state.tracked[layer] = torch.where(busy[:, None], new, old)
            state.reference[layer] = torch.where(busy[:, None, None, None], reference, state.reference[layer])
            h = stack.finish(layer, h, p, layers.values[layer])
        return h, start

    def _similarity(self, stack: Stack, now: Tensor, reference: Tensor, mask: Tensor) -> Tensor:
        """(B,) mean cosine similarity of (B, H, T, L) attention now and when chosen: over the key
        axis per head (`drift="keys"`), or over the head axis per attended key (`"heads"`, the
        reference's `dim=1`). Under tensor parallelism the per-head cosines' sum (keys), or the
        dot products and squared norms over the local heads (heads), are all-reduced first (one
        all_reduce)."""
        if self.drift == "keys":
            if stack.group_name is None:
                return F.cosine_similarity(now, reference, dim=-1).mean((1, 2))
            cosines = F.cosine_similarity(now, reference, dim=-1)           # (B, H_local, T)
            return stack.head_sum(cosines.sum((1, 2))) / (cosines.shape[1] * stack.tp * cosines.shape[2])
        keys = mask[:, 0].float()                                          # (B, 1, L)
        if stack.group_name is None:
            per_key = F.cosine_similarity(now, reference, dim=1)           # (B, T, L)
        else:                                                              # F.cosine_similarity's rule
            dot, nn_, rr = stack.head_sum(torch.stack(
                [(now * reference).sum(1), (now * now).sum(1), (reference * reference).sum(1)]))
            per_key = dot / (nn_ * rr).clamp_min(1e-16).sqrt()
        return ((per_key * keys).sum(-1) / keys.sum(-1)).mean(-1)

    @staticmethod
    def _attention(stack: Stack, layers: LayerState, positions: Tensor, mask: Tensor, layer: int,
                   tracked: Tensor) -> Tensor:
        """(B, H, T, L) attention of the tracked columns, from their cached inputs."""
        x = layers.inputs[layer].gather(1, tracked[..., None].expand(-1, -1, layers.inputs[layer].shape[-1]))
        q, _, _ = stack.project(layer, x, stack.rope(positions.gather(1, tracked)), need_kv=False)
        return stack.probs(layer, q, layers.keys[layer], mask)

    def _refresh(self, stack: Stack, state: ElasticState, positions: Tensor, mask: Tensor,
                 start: Tensor, first: int, chosen) -> Tensor:
        """Every column through layers `first`.. for the rows whose refresh starts at or before
        each layer (`start`, (B,)); the others keep the cheap pass. Returns (B, L, d)."""
        layers = state.layers
        rope = stack.rope(positions)
        h = layers.inputs[first]
        for layer in range(first, stack.depth):
            on = (layer >= start)
            x = torch.where((layer > start)[:, None, None], h, layers.inputs[layer])
            layers.inputs[layer] = torch.where(on[:, None, None], x, layers.inputs[layer])
            q, k, v = stack.project(layer, x, rope)
            layers.keys[layer] = torch.where(on[:, None, None, None], k, layers.keys[layer])
            layers.values[layer] = torch.where(on[:, None, None, None], v, layers.values[layer])
            p = stack.probs(layer, q, layers.keys[layer], mask)
            tracked = torch.where(on[:, None], chosen(p, 0), state.tracked[layer])
            reference = p.gather(2, tracked[:, None, :, None].expand(-1, p.shape[1], -1, p.shape[-1]))
            state.reference[layer] = torch.where(on[:, None, None, None], reference, state.reference[layer])
            state.tracked[layer] = tracked
            h = stack.finish(layer, x, p, layers.values[layer])
        return h
