"""SparseD: head-specific sparse attention, its pattern computed once per request and reused
(Wang et al., 2025, arXiv 2509.24014, ICLR 2026; code INV-WZQ/SparseD@52155b4,
`models/LLaDA/modeling_llada.py` `attention`, `models/LLaDA/SparseD_utils.py`).

The rule, as the reference runs it. A request's forwards are counted n = 0, 1, ...; with T its
step count and E = int(T * skip) + 1:
  * n < E: dense attention;
  * n == E: dense attention, and per layer, per head, per query tile (tiles of `tile` columns)
    the key tiles to keep are chosen from this forward's rotated Q and K:
      1. A = softmax(Q_tile K^T * scale) over every key; a key tile's importance is A summed over
         the (query tile, key tile) square (the reference's mean over the zero-padded square:
         the same ranking); keep the top int(n_kt * select) + 1 of the n_kt key tiles;
      2. drop the kept tiles from the generation's first tile on, choose again among the
         generation's key tiles only (softmax over those keys, same keep rule) and add them
         ("isolated selection": prompt and generation keys are selected apart);
  * n > E: attention restricted to the kept (query tile, key tile) squares.
The generation's first tile is the first tile starting at or after the generation start (the
last tile when none does), as the reference's `last`.

This is a model-side attention back end (`load_model(attention="sparsed")`), not a cache: its
per-request state (`SparseState`) rides in the `kv` argument of the model's forward, which the
`none` cache passes, and the attention of both runtimes calls `SparseState.attend`.

Deviations from the reference, each stated:
  * Tiles are counted from each row's first real token (positions, not canvas columns), and
    padded keys are never attended nor selected: a row's pattern does not depend on its
    batch-mates' padding (the reference runs batch 1 with `attn_mask=None`).
  * The step count n advances only on a forward after which the row's [MASK] count changed, so a
    row waiting for its batch-mates' blocks does not advance (the same n as decoded alone). A
    revising rule that commits and remasks as many tokens counts such a forward as a repeat.
  * T: adaptive rules have no fixed step count; `steps = 0` takes the row's generation length
    (its [MASK] count at its first forward), the reference's default (`steps = seq_len = 128`).
  * `scale = "head_dim"` (default) scores with 1/sqrt(head dim), the model's own scale; the
    reference scores the selection with 1/sqrt(n_heads) (`scale = "n_heads"` reproduces it).
  * Ties between equal importances go to the lower key tile (the reference's `topk` is unsorted,
    its tie order unspecified); a keep count above the tile count keeps every tile (the
    reference's `topk` fails).
  * The sparse step gathers each query tile's kept key tiles and runs SDPA over them
    (`tile_attention`: plain torch, any device), where the reference runs FlexAttention's
    block-sparse kernel (compiled per shape, CUDA). Both skip the dropped squares' work.
  * Padding: rows are left-padded (the loop's layout): a row's real columns end the canvas.
  * One host sync per forward (which rows build, which run sparse) besides the loop's own.
  * The pattern is built once per request at its n == E, also under semi-autoregressive blocks
    (the reference's behaviour: later blocks reuse a pattern built while they were masked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, Checked, bounded, check_probability

SCALES = ("head_dim", "n_heads")
QUERY_CHUNK = 1 << 24
"""The most (query rows x keys x heads) scores a pattern build holds at once."""


@dataclass(frozen=True)
class DenseAttention(Checked):
    """Plain scaled-dot-product attention over every key the model's mask allows (the default)."""

    families: ClassVar[str] = "every family"
    caches: ClassVar[tuple[str, ...] | None] = None

    def problem(self, model: Any) -> str | None:
        return None

    def new_state(self, model: Any) -> None:
        return None


@dataclass(frozen=True)
class SparseD(Checked):
    """SparseD's options (reference defaults: `skip` 0.2, `select` 0.3, `block_size` 128; the
    README's short-context example uses `select` 0.5, `block_size` 32).

    Attributes:
        skip: share of the T steps that run dense before the pattern is built (E = int(T*skip)+1).
        select: share of key tiles kept per (head, query tile), plus one.
        tile: the square's side in tokens (the reference's `block_size`).
        steps: T; 0 = the request's generation length.
        scale: `head_dim` (the model's own softmax scale) or `n_heads` (the reference's).
    """

    skip: float = 0.2
    select: float = 0.3
    tile: int = bounded(128, most=MAX_CANVAS, scales="canvas")
    steps: int = bounded(0, most=MAX_CANVAS, scales="steps")
    scale: str = "head_dim"

    families: ClassVar[str] = "bidirectional plain-torch families (LLaDA layout, Dream)"
    caches: ClassVar[tuple[str, ...] | None] = ("none",)

    def __post_init__(self) -> None:
        check_probability(self, "skip")
        if not 0.0 <= self.select <= 1.0:
            raise ValueError(f"select must be in [0, 1] (1 keeps every tile), got {self.select}")
        if self.tile < 1:
            raise ValueError(f"tile must be >= 1, got {self.tile}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0 (0: the generation length), got {self.steps}")
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {list(SCALES)}, got {self.scale!r}")

    def problem(self, model: Any) -> str | None:
        """Why `model` cannot run SparseD (a phrase), or None."""
        from dllm_decode.models.layers import BlockCausal, BlockStackLM

        if not isinstance(model, BlockStackLM):
            return f"{type(model).__name__} is not one of this package's plain-torch models"
        if isinstance(model, BlockCausal):
            return "a block-causal model's attention is block-sparse already"
        return None

    def new_state(self, model: Any) -> SparseState:
        return SparseState(self, int(model.mask_token_id))


@dataclass
class SparseState:
    """One running batch's SparseD state, per row: forwards counted, generation length, [MASK]
    count at the last forward, patterns built; per layer the (B, H, nT, nT) bool tile pattern.

    The `kv` object of a `none`-cache forward: it stores no K/V (`filled` is False, so every
    forward computes every column) and runs each layer's attention (`attend`).
    """

    options: SparseD
    mask_id: int
    step: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    gen: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    masked: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    builds: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    plans: list[Tensor] = field(default_factory=list)
    # this forward's view (set by `begin`)
    tiles: Tensor | None = None          # (B, L) tile of each column (position // tile)
    real: Tensor | None = None           # (B, L) bool, not padding
    building: Tensor | None = None       # (B,) bool
    sparse: Tensor | None = None         # (B,) bool
    any_building: bool = False
    any_sparse: bool = False

    filled: ClassVar[bool] = False

    @property
    def all_queries(self) -> bool:
        """A pattern build reads every column's query in every layer."""
        return self.any_building

    def begin(self, canvas: Tensor, attention_mask: Tensor | None) -> None:
        """Count this forward for each row of `canvas` (B, L) and fix each row's mode. Rows past
        the state's are newcomers appended by the running batch."""
        batch, width = canvas.shape
        device = canvas.device
        self._grow(batch, device)
        masked = (canvas == self.mask_id).sum(1)
        first = self.masked < 0
        self.gen = torch.where(first, masked, self.gen)
        self.step = self.step + (masked != self.masked).long()     # new rows start at -1: n = 0
        self.masked = masked
        total = self.gen if self.options.steps == 0 else torch.full_like(self.gen, self.options.steps)
        switch = (total.double() * self.options.skip).floor().long() + 1
        self.building = (self.step == switch) & (self.builds == 0)
        self.sparse = self.step > switch
        self.builds = self.builds + self.building.long()
        self.real = (torch.ones_like(canvas, dtype=torch.bool) if attention_mask is None
                     else attention_mask.bool())
        positions = (self.real.long().cumsum(1) - 1).clamp_min(0)
        self.tiles = torch.div(positions, self.options.tile, rounding_mode="floor")
        self.any_building, self.any_sparse = (bool(f) for f in torch.stack(
            [self.building.any(), self.sparse.any()]).tolist())        # the one host sync

    def _grow(self, batch: int, device: torch.device) -> None:
        new = batch - self.step.shape[0]
        if new <= 0:
            return
        extend = lambda t, value: torch.cat([t.to(device), torch.full((new,), value, dtype=torch.long, device=device)])  # noqa: E731
        self.step, self.gen = extend(self.step, -1), extend(self.gen, 0)
        self.masked, self.builds = extend(self.masked, -1), extend(self.builds, 0)
        self.plans = [torch.cat([p, p.new_zeros(new, *p.shape[1:])]) for p in self.plans]

    def update(self, layer: int, k: Tensor, v: Tensor, rows: Any) -> tuple[Tensor, Tensor]:
        return k, v                      # no K/V kept: every forward is a full one

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               query_start: int = 0) -> Tensor:
        """Layer `layer`'s attention of queries q (B, H, Lq, D) at canvas columns
        `[query_start, query_start + Lq)` over keys k, v (B, Hkv, L, D)."""
        from dllm_decode.models.layers import sdpa

        if self.any_building:
            self._build(layer, q, k)
        if not self.any_sparse:
            return sdpa(q, k, v, mask)
        plan = self._plan(layer, q) | ~self.sparse[:, None, None, None]   # rows not yet sparse: every tile
        first = self.real.long().argmax(1)                                # left padding: first real column
        return tile_attention(q, k, v, plan, first, self.options.tile, query_start)

    def mask(self, layer: int, queries: int, query_start: int) -> Tensor:
        """(B, H, Lq, L) bool: the pattern's squares for sparse rows, every real key for others
        (`tile_attention`'s pattern as an SDPA mask: the exact reference it is tested against)."""
        plan = self.plans[layer]
        batch, heads, n_tiles, _ = plan.shape
        q_tiles = self.tiles[:, query_start:query_start + queries].clamp_max(n_tiles - 1)
        k_tiles = self.tiles.clamp_max(n_tiles - 1)
        rows = torch.gather(plan, 2, q_tiles[:, None, :, None].expand(batch, heads, queries, n_tiles))
        keep = torch.gather(rows, 3, k_tiles[:, None, None, :].expand(batch, heads, queries, k_tiles.shape[1]))
        keep = keep | ~self.sparse[:, None, None, None]
        return keep & self.real[:, None, None, :]

    def _plan(self, layer: int, q: Tensor) -> Tensor:
        """Layer `layer`'s (B, H, nT, nT) pattern, nT covering this canvas (new squares unkept)."""
        n_tiles = -(-self.tiles.shape[1] // self.options.tile)
        if len(self.plans) <= layer:
            self.plans.append(torch.zeros(q.shape[0], q.shape[1], n_tiles, n_tiles, dtype=torch.bool,
                                          device=q.device))
        plan = self.plans[layer]
        if plan.shape[2] < n_tiles:                        # a wider canvas than at earlier builds
            grown = plan.new_zeros(plan.shape[0], plan.shape[1], n_tiles, n_tiles)
            grown[:, :, :plan.shape[2], :plan.shape[3]] = plan
            self.plans[layer] = plan = grown
        return plan

    def _build(self, layer: int, q: Tensor, k: Tensor) -> None:
        """Choose the building rows' tiles for `layer` from their queries (all columns) and keys."""
        plan = self._plan(layer, q)
        n_tiles, heads = -(-self.tiles.shape[1] // self.options.tile), q.shape[1]
        rows = self.building.nonzero().squeeze(1)
        scale = q.shape[-1] ** -0.5 if self.options.scale == "head_dim" else heads ** -0.5
        chosen = choose_tiles(q.index_select(0, rows), k.index_select(0, rows), self.real.index_select(0, rows),
                              self.gen.index_select(0, rows), self.options.tile, self.options.select,
                              scale, n_tiles)
        plan[rows, :, :n_tiles, :n_tiles] = chosen
        plan[rows, :, :, n_tiles:] = False

    def select_rows(self, rows: Tensor) -> SparseState:
        pick = lambda t: t.index_select(0, rows.to(t.device))   # noqa: E731
        return SparseState(self.options, self.mask_id, pick(self.step), pick(self.gen),
                           pick(self.masked), pick(self.builds), [pick(p) for p in self.plans])

    def trim(self, width: int) -> SparseState:
        return self                      # tiles follow positions: a shorter canvas keeps them


def tile_attention(q: Tensor, k: Tensor, v: Tensor, plan: Tensor, first: Tensor, tile: int,
                   query_start: int = 0) -> Tensor:
    """Attention restricted to the kept (query tile, key tile) squares, computing only those.

    Each row's columns are first laid out on its tile grid (one gather of the canvas); then each
    (row, head, query tile) takes its kept key tiles as whole blocks (padded to the batch's
    largest kept count, the padding masked) and attends over them alone, through SDPA: the work
    is the kept share of the dense scores plus the block copies.

    Args:
        q: (B, H, Lq, D) queries of canvas columns `[query_start, query_start + Lq)`.
        k, v: (B, Hkv, L, D) keys and values of every column.
        plan: (B, H, nT, nT) bool kept key tiles per query tile.
        first: (B,) each row's first real column (rows are left-padded; tile j of a row covers
            columns `first + j * tile` onwards).
    Returns:
        (B, H, Lq, D); columns in no tile (padding) are zero.
    """
    batch, heads, queries, dim = q.shape
    kv_heads, length, n_tiles = k.shape[1], k.shape[2], plan.shape[-1]
    cols = first[:, None] + torch.arange(n_tiles * tile, device=q.device)      # (B, nT*tile)
    real = (cols < length).view(batch, n_tiles, tile)

    def on_grid(t: Tensor, index: Tensor) -> Tensor:                         # (B, h, nT, tile, D)
        grid = torch.gather(t, 2, index[:, None, :, None].expand(-1, t.shape[1], -1, dim))
        return grid.view(batch, t.shape[1], n_tiles, tile, dim)

    key_index = cols.clamp_max(length - 1)
    keys, values = on_grid(k, key_index), on_grid(v, key_index)
    tiled_q = on_grid(q, (cols - query_start).clamp(0, queries - 1))
    counts = plan.sum(-1)                                                    # (B, H, nT)
    widest = max(1, int(counts.max()))
    picked = torch.sort(plan.to(torch.int8), dim=-1, descending=True, stable=True).indices[..., :widest]
    rows = torch.arange(batch, device=q.device)[:, None, None, None]
    kv_head = (torch.arange(heads, device=q.device) // (heads // kv_heads))[None, :, None, None]
    blocks = ((rows * kv_heads + kv_head) * n_tiles + picked).flatten()     # whole key tiles
    squares = batch * heads * n_tiles                                        # one SDPA entry each
    take = lambda t: t.reshape(-1, tile * dim).index_select(0, blocks).view(squares, 1, -1, dim)  # noqa: E731
    allowed = real[rows, picked] & (torch.arange(widest, device=q.device) < counts[..., None])[..., None]
    out = F.scaled_dot_product_attention(tiled_q.reshape(squares, 1, tile, dim), take(keys), take(values),
                                         attn_mask=allowed.reshape(squares, 1, 1, -1))
    out = out.view(batch, heads, n_tiles * tile, dim)
    slot = torch.arange(queries, device=q.device)[None] + query_start - first[:, None]     # (B, Lq)
    inside = (slot >= 0) & (slot < n_tiles * tile)
    result = torch.gather(out, 2, slot.clamp(0, n_tiles * tile - 1)[:, None, :, None].expand(-1, heads, -1, dim))
    return result * inside[:, None, :, None]


def choose_tiles(q: Tensor, k: Tensor, real: Tensor, gen: Tensor, tile: int, select: float,
                 scale: float, n_tiles: int) -> Tensor:
    """SparseD's two-pass selection (module docstring), vectorised over rows, heads and tiles.

    Args:
        q: (B, H, L, D) rotated queries of every canvas column; k: (B, Hkv, L, D) rotated keys.
        real: (B, L) bool, not padding (left padding: a row's real columns end the canvas).
        gen: (B,) generation length of each row.
    Returns:
        (B, H, nT, nT) bool: key tiles kept per (head, query tile).
    """
    batch, heads, length, dim = q.shape
    if k.shape[1] != heads:
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
    span = n_tiles * tile
    cols = real.long().argmax(1)[:, None] + torch.arange(span, device=q.device)   # on the tile grid
    on = cols < length                                                       # (B, nT*tile) real
    index = cols.clamp_max(length - 1)[:, None, :, None].expand(-1, heads, -1, dim)
    q, k = torch.gather(q, 2, index), torch.gather(k, 2, index)
    key_tiles = -(-real.sum(1) // tile)                                     # (B,) real key tiles
    first_gen = torch.minimum(-(-(real.sum(1) - gen) // tile), key_tiles - 1)   # the reference's `last`
    tile_index = torch.arange(n_tiles, device=q.device)
    valid = tile_index[None] < key_tiles[:, None]                            # (B, nT)
    generation = valid & (tile_index[None] >= first_gen[:, None])
    gen_keys = on & (torch.arange(span, device=q.device)[None] // tile >= first_gen[:, None])
    everything, isolated = importance(q, k, on, gen_keys, tile, scale)
    kept = top_tiles(everything, valid, select) & ~generation[:, None, None, :]
    return kept | top_tiles(isolated, generation, select)


def importance(q: Tensor, k: Tensor, keys: Tensor, gen_keys: Tensor, tile: int,
               scale: float) -> tuple[Tensor, Tensor]:
    """Two (B, H, nT, nT) float32 importances of grid-laid q, k (B, H, nT*tile, D): the softmax
    of Q K^T * scale over the `keys` (B, nT*tile) bool, and over `gen_keys`, each summed over
    every (query tile, key tile) square; real queries only; query tiles in chunks to bound memory."""
    batch, heads, span, _ = q.shape
    n_tiles = span // tile
    out = [q.new_zeros(batch, heads, n_tiles, n_tiles, dtype=torch.float32) for _ in range(2)]
    chunk = max(1, QUERY_CHUNK // max(1, heads * span * batch * tile))      # query tiles at once
    for first in range(0, n_tiles, chunk):
        rows = slice(first * tile, (first + chunk) * tile)
        scores = (q[:, :, rows] @ k.transpose(2, 3)).float() * scale
        count = scores.shape[2] // tile
        for allowed, total in zip((keys, gen_keys), out):
            weights = torch.softmax(scores.masked_fill(~allowed[:, None, None, :], float("-inf")), -1)
            weights = weights.to(q.dtype).float() * keys[:, None, rows, None]
            total[:, :, first:first + count] = weights.view(
                batch, heads, count, tile, n_tiles, tile).sum((3, 5))
    return out[0], out[1]


def top_tiles(score: Tensor, valid: Tensor, select: float) -> Tensor:
    """(B, H, nT, nT) bool: per (row, head, query tile) the int(n * select) + 1 best `valid`
    (B, nT) key tiles, n the row's valid count (capped at n); ties go to the lower tile."""
    count = valid.sum(1)
    keep = torch.minimum((count.double() * select).floor().long() + 1, count)     # (B,)
    score = score.masked_fill(~valid[:, None, None, :], float("-inf"))
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(
        score.shape[-1], device=score.device).expand_as(order))
    return (rank < keep[:, None, None, None]) & valid[:, None, None, :]
