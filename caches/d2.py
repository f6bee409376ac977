"""d2Cache (Jiang et al., 2025, arXiv 2509.23094):
per-step, per-token selection of the columns whose K/V are recomputed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.caches.layerwise import LayerState, Stack, check_model, confidence
from dllm_decode.interfaces import Cache, DiffusionLM


@dataclass
class D2State:
    """The layer caches; per column the confidence when last computed (B, L) and the attention
    rollout importance of the last step (B, L); the earliest column the last step fed; the number
    of steps since the last full forward; the step's counts."""

    layers: LayerState
    conf: Tensor
    importance: Tensor
    fed_from: int
    since_refresh: int
    refreshed: Tensor
    recomputed: Tensor

    def select_rows(self, rows: Tensor) -> D2State:
        return D2State(self.layers.select_rows(rows), self.conf.index_select(0, rows),
                       self.importance.index_select(0, rows), self.fed_from, self.since_refresh,
                       self.refreshed.index_select(0, rows), self.recomputed.index_select(0, rows))


@dataclass(frozen=True)
class D2Cache(Cache):
    """Recompute, each step, the active block plus a few chosen columns through every layer; every
    other column keeps its cached K/V.

    The chosen columns, each step per row:
      1. masks after the block, by `conf x certainty_density` (the confidence when the column was
         last computed, times a Gaussian kernel of std `sigma` over the decoded indicator, so masks
         next to decoded text come first), up to `current_k` masks counting the block's;
      2. the tokens decoded in the last step (always inside the fed block range);
      3. committed columns by attention rollout: R = prod_l rownorm(mean_h A_l + I) over the last
         step's query rows (identity rows elsewhere), importance_j = sum_i R_ij, the nucleus of
         mass `rollout_p` of the rest (at most `rollout_cap` columns).
    The first step of a decode (and every `refresh_k`-th step after it) is a full forward that
    records every column's confidence and the rollout over all rows.

    Deviations from the reference (`Kamichanw/d2Cache@72feb60`, `src/cache/d2cache.py`):
      * the loop's active block is always recomputed whole (the loop needs its logits); the block
        counts as `min(current_k, block masks upper bound)` of the `current_k` mask slots, the
        bound being `block length - block_step` (known on the host: no sync), so the masks after
        the block get `current_k - (block length - block_step)` slots and rows with fewer masks
        left get fewer slots than the reference's exact top-up;
      * the search window for masks is every mask up to `suffix_window` after the block (default
        the whole canvas) instead of the end of the block holding the current_k-th mask;
      * the rollout nucleus is capped at `rollout_cap` columns (fixed shapes, no host sync); the
        inflation step (`inflate_w`, 0 in the reference's YAML) is not implemented;
      * the confidences are stored per column as they are computed (the reference's `conf_cache`
        write goes to a temporary and keeps the first step's values, a pitfall of §2.2);
      * `suffix_window` also drops the masks more than that many columns after the block from
        attention (Streaming-dLLM's window; the last canvas column is kept), off by default;
      * rows that join a running batch make its next step a full forward for every row, so a
        running batch takes no newcomer mid-run (`mid_run_joins`).

    Attributes:
        current_k: mask slots per step, the block's masks included (paper: 32).
        rollout_p: nucleus mass of the attention-rollout selection (paper: 0.1).
        rollout_cap: the most columns the rollout adds per step.
        sigma: std of the certainty-density kernel, in columns (paper: 10.0); 0 = no density.
        refresh_k: None, or a full forward every `refresh_k` steps (of the batch: a row that
            waits for the others' blocks still counts them, so with a period a batch is not
            decoded exactly like each prompt alone; the default None is).
        suffix_window: None, or the masks after the block kept in attention and selectable.
    """

    capturable: ClassVar[bool] = False    # rows chosen from the data each step: always eager
    mid_run_joins: ClassVar[bool] = False  # a join makes the next step a full forward for every row

    current_k: int = bounded(32, most=65536, scales="work")
    rollout_p: float = 0.1
    rollout_cap: int = bounded(8, most=65536, scales="work")
    sigma: float = 10.0
    refresh_k: int | None = bounded(None, most=MAX_CANVAS, scales="memory")
    suffix_window: int | None = bounded(None, most=MAX_CANVAS, scales="memory")

    def __post_init__(self) -> None:
        for name in ("current_k", "rollout_cap"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.rollout_p <= 1.0:
            raise ValueError(f"rollout_p must be in [0, 1], got {self.rollout_p}")
        if self.sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")
        if self.refresh_k is not None and self.refresh_k < 1:
            raise ValueError(f"refresh_k must be >= 1 or None, got {self.refresh_k}")
        if self.suffix_window is not None and self.suffix_window < 0:
            raise ValueError(f"suffix_window must be >= 0 or None, got {self.suffix_window}")

    def init_state(self, model: DiffusionLM) -> None:
        check_model(model, "d2")
        return None

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any) -> tuple[Tensor, int, Any]:
        stack, (s, e) = Stack(model), block
        batch, length = canvas.shape
        positions, mask, masked = stack.inputs(canvas, attention_mask, e, self.suffix_window)
        if state is None or (self.refresh_k is not None and state.since_refresh + 1 >= self.refresh_k):
            rollout = _Rollout(torch.ones(batch, length, device=canvas.device), None, stack)
            h, layers = stack.full(canvas, positions, mask, rollout.add)
            conf = confidence(stack.head(h), model.mask_token_id)
            full = torch.full((batch,), stack.depth, dtype=torch.long, device=canvas.device)
            state = D2State(layers, conf, rollout.importance(), s, 0, full, torch.full_like(full, length))
            return stack.head(h[:, s:]), s, state
        a = min(state.fed_from, s)
        cut = None if self.suffix_window is None else e + self.suffix_window
        index, valid = self._select(state, masked, mask[:, 0, 0], (a, e), e - s - block_step, cut)
        rollout = _Rollout(torch.ones(batch, length, device=canvas.device), (index, valid), stack)
        h = stack.rows(state.layers, canvas, positions, mask, index, rollout.add)
        logits = stack.head(h[:, s - a:])                          # the block and the chosen columns
        conf = confidence(logits, model.mask_token_id)
        state.conf = state.conf.scatter(1, index[:, s - a:], conf)
        state.importance = rollout.importance()
        state.fed_from, state.since_refresh = s, state.since_refresh + 1
        state.refreshed = torch.zeros_like(state.refreshed)
        state.recomputed = valid.sum(-1)
        return logits[:, :e - s], s, state

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        return state.select_rows(rows) if isinstance(state, D2State) else state

    def report(self, state: Any) -> dict[str, Tensor] | None:
        if not isinstance(state, D2State):
            return None
        return {"refreshed_layers": state.refreshed, "recomputed": state.recomputed}

    def trim(self, state: Any, width: int) -> Any:
        if not isinstance(state, D2State):
            return state
        return D2State(state.layers.trim(width), state.conf[:, :width], state.importance[:, :width],
                       state.fed_from, state.since_refresh, state.refreshed, state.recomputed)

    def _select(self, state: D2State, masked: Tensor, attended: Tensor, fed: tuple[int, int],
                block_masks: int, cut: int | None) -> tuple[Tensor, Tensor]:
        """(B, n) columns to recompute (the fed range first) and (B, n) which of them are chosen
        (the rest are padding picks: recomputed, harmless, not counted)."""
        a, e = fed
        batch, length = masked.shape
        columns = torch.arange(length, device=masked.device)
        outside = ((columns < a) | (columns >= e)) & attended
        parts = [columns[a:e].expand(batch, -1)]
        valid = [torch.ones(batch, e - a, dtype=torch.bool, device=masked.device)]
        slots = min(max(self.current_k - max(block_masks, 0), 0), length - e)
        if slots:
            candidates = masked & outside & (columns >= e)
            if cut is not None:
                candidates = candidates & (columns < cut)
            score = state.conf * self._density(~masked & attended)
            top = score.masked_fill(~candidates, -1.0).topk(slots, dim=-1)
            parts.append(top.indices)
            valid.append(top.values >= 0)
        cap = min(self.rollout_cap, length)
        if cap and self.rollout_p > 0:
            importance = state.importance.masked_fill(masked | ~outside, 0.0)
            top = importance.topk(cap, dim=-1)
            before = top.values.cumsum(-1) - top.values           # mass of the better ones
            total = importance.sum(-1, keepdim=True)
            parts.append(top.indices)
            valid.append((before < self.rollout_p * total) & (top.values > 0))
        return torch.cat(parts, 1), torch.cat(valid, 1)

    def _density(self, decoded: Tensor) -> Tensor:
        """(B, L) Gaussian-smoothed decoded indicator, normalised to 1 at its peak (zero padding)."""
        if self.sigma == 0:
            return torch.ones_like(decoded, dtype=torch.float32)
        radius = int(math.ceil(3 * self.sigma))
        offsets = torch.arange(-radius, radius + 1, device=decoded.device, dtype=torch.float32)
        kernel = torch.exp(-0.5 * (offsets / self.sigma) ** 2)
        density = F.conv1d(decoded.float()[:, None], (kernel / kernel.sum())[None, None], padding=radius)
        return density[:, 0]


class _Rollout:
    """Attention rollout accumulated layer by layer: importance = 1^T M_{L-1} ... M_0 with
    M_l = rownorm(mean_h A_l + I) on the query rows and identity elsewhere (Abnar & Zuidema,
    2020), as a vector-matrix product, from the last layer down.

    Under tensor parallelism each layer keeps its local heads' sum, and `importance` all-reduces
    every layer's at once: one all_reduce of (layers, B, n, L) float32 per step."""

    def __init__(self, ones: Tensor, rows: tuple[Tensor, Tensor] | None, stack: Stack | None = None):
        self.ones, self.rows, self.layers = ones, rows, []
        self.stack = stack if stack is not None and stack.group_name is not None else None

    def add(self, layer: int, p: Tensor) -> None:
        self.heads = p.shape[1]
        self.layers.append(p.mean(1) if self.stack is None else p.sum(1))   # (B, n, L)

    def importance(self) -> Tensor:
        u, layers = self.ones, self.layers
        if self.stack is not None and layers:
            layers = list((self.stack.head_sum(torch.stack(layers)) / (self.heads * self.stack.tp)).unbind(0))
        for a in reversed(layers):
            if self.rows is None:                                   # every row is a query row
                eye = torch.eye(a.shape[-1], device=a.device)
                m = a + eye
                u = torch.einsum("bi,bij->bj", u, m / m.sum(-1, keepdim=True))
                continue
            index, valid = self.rows
            m = a.scatter_add(-1, index[..., None], torch.ones_like(index[..., None], dtype=a.dtype))
            m = m / m.sum(-1, keepdim=True)                         # rownorm(A + I) on the rows
            weight = u.gather(1, index) * valid.float()             # (B, n); padding picks count 0
            u = u.scatter_add(1, index, -weight) + torch.einsum("bi,bij->bj", weight, m)
        return u
