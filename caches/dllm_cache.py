"""dLLM-Cache: a long-interval prompt cache and an adaptive partial refresh of the response
(Liu et al., 2025, arXiv 2506.06295; code maomaocun/dLLM-cache@17235bf `dllm_cache/hooks/
cache_hook_LLaDA.py`, `cache_hook_feature`, `refresh_index`; `dllm_cache/cache/Cache.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.caches.layerwise import Stack, check_model
from dllm_decode.interfaces import Cache, DiffusionLM
from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.row_windows import RowWindows


@dataclass
class FeatureState:
    """Per layer: rotated keys and values (B, Hkv, L, D), attention and FFN outputs (B, L, d);
    the first response column; each row's call counter (host ints); the step's counts."""

    keys: list[Tensor]
    values: list[Tensor]
    attn: list[Tensor]
    ffn: list[Tensor]
    gen_start: int
    step: tuple[int, ...]
    refreshed: Tensor
    recomputed: Tensor

    def _map(self, f) -> FeatureState:
        return FeatureState([f(t, 2) for t in self.keys], [f(t, 2) for t in self.values],
                            [f(t, 1) for t in self.attn], [f(t, 1) for t in self.ffn],
                            self.gen_start, self.step, self.refreshed, self.recomputed)

    def select_rows(self, rows: Tensor, host: list[int] | None = None) -> FeatureState:
        """Batch `rows` of the state (`host`: the same rows as host ints, when the caller has
        them; otherwise they are read from `rows`, one host sync, as rows leave)."""
        out = self._map(lambda t, _: t.index_select(0, rows))
        out.refreshed, out.recomputed = self.refreshed.index_select(0, rows), self.recomputed.index_select(0, rows)
        out.step = tuple(self.step[i] for i in (rows.tolist() if host is None else host))
        return out

    def place(self, rows: list[int], part: FeatureState) -> None:
        """Write `part`, the state of batch `rows` after a step of theirs alone, into these rows."""
        index = torch.tensor(rows, device=self.refreshed.device)
        for mine, theirs in ((self.keys, part.keys), (self.values, part.values), (self.attn, part.attn),
                             (self.ffn, part.ffn), ([self.refreshed, self.recomputed], [part.refreshed, part.recomputed])):
            for t, new in zip(mine, theirs):
                t.index_copy_(0, index, new)
        self.step = tuple(part.step[rows.index(r)] if r in rows else n for r, n in enumerate(self.step))

    def trim(self, width: int) -> FeatureState:
        return self._map(lambda t, dim: t.narrow(dim, 0, width))


@dataclass(frozen=True)
class DLLMCache(Cache):
    """Cache, per layer, the K/V, attention output and FFN output of every column; recompute the
    prompt every `prompt_every` steps and the response every `gen_every` steps, and in between
    the `ratio` share of response columns whose value vectors moved most.

    Each step the residual stream is rebuilt from the canvas (so committed tokens enter at once)
    and every layer adds its cached attention and FFN outputs, except for what it recomputes:
      * at a prompt refresh, the prompt rows; at a response refresh, the response rows (both:
        the full layer); layer 0 always in full (`first_layer_full`, as the reference);
      * otherwise, with `ratio > 0`, every response column's value vector is recomputed and
        compared with the cached one (cosine over the whole vector), and the int(G * ratio)
        least similar columns (G response columns) get their key, attention output (attending
        over every column) and FFN output recomputed; all response values are replaced.
    A refresh counts as the step's forward (one NFE per step as every cache here).

    Defaults: the README demo (LLaDA): `prompt_every = 100`, `gen_every = 7`, `ratio = 0.25`.
    `prompt_every = gen_every = 1` recomputes every layer every step: the `none` cache.
    The intervals count each row's own steps (the reference counts the batch's): a row that
    waits for the others' blocks keeps its counter and its state, and rows whose next steps
    refresh different parts run apart (one forward per group, at most four, only after a wait),
    so a batch decodes each prompt as alone. A newcomer would restart the counters of the running
    rows (its state starts with a full forward of the batch), so a running batch takes none
    mid-run (`mid_run_joins`; the engine starts another running batch).

    Deviations (fixing the reference's pitfalls): one state per request, no process-wide
    singleton; padding is never attended (the reference passes no mask); row-batched rotary
    tables (no loop over rows); the response starts at the first decoded block's start (the
    padded prompt width, as the reference's single `prompt_length`); `refresh_at_block` (off by
    default, as the reference) adds a full refresh at every block start. The similarity top-k
    breaks ties by `torch.topk`, as the reference. LLaDA layout only (`caches/layerwise.py`);
    other families get a one-line error.
    """

    own_windows: ClassVar[bool] = True     # rows that wait keep their counters
    mid_run_joins: ClassVar[bool] = False  # a newcomer would restart the running rows' counters

    prompt_every: int = bounded(100, most=MAX_CANVAS, scales="steps")
    gen_every: int = bounded(7, most=MAX_CANVAS, scales="steps")
    ratio: float = 0.25
    refresh_at_block: bool = False
    first_layer_full: bool = True

    def __post_init__(self) -> None:
        for name in ("prompt_every", "gen_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (1: recompute every step), got {getattr(self, name)}")
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"ratio must be in [0, 1] (0: no partial refresh), got {self.ratio}")

    def init_state(self, model: DiffusionLM) -> None:
        check_model(model, "dllm_cache")
        return None

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any,
               rows: RowWindows | None = None) -> tuple[Tensor, int, Any]:
        """`rows`: a row whose block is done waits (its counter and state untouched, its logits
        zero: it has nothing to commit); rows whose next steps refresh different parts step
        apart (at most four groups), so every row refreshes on its own schedule."""
        if state is None or (self.refresh_at_block and block_step == 0):
            return self._step(model, canvas, attention_mask, block, block_step, state)
        busy = (True,) * canvas.shape[0] if rows is None else rows.busy
        groups: dict[tuple[bool, bool], list[int]] = {}     # what the rows' next steps recompute
        for r, (working, n) in enumerate(zip(busy, state.step)):
            if working:
                groups.setdefault(((n + 1) % self.prompt_every == 0, (n + 1) % self.gen_every == 0), []).append(r)
        if len(groups) <= 1 and all(busy) or not groups:
            return self._step(model, canvas, attention_mask, block, block_step, state)
        logits = None
        state.refreshed, state.recomputed = torch.zeros_like(state.refreshed), torch.zeros_like(state.recomputed)
        for members in groups.values():
            index = torch.tensor(members, device=canvas.device)
            part, offset, after = self._step(model, canvas[index], None if attention_mask is None else
                                             attention_mask[index], block, block_step,
                                             state.select_rows(index, members))
            state.place(members, after)
            logits = part.new_zeros(canvas.shape[0], *part.shape[1:]) if logits is None else logits
            logits[index] = part
        return logits, block[0], state

    def _step(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
              block: tuple[int, int], block_step: int, state: Any) -> tuple[Tensor, int, Any]:
        """One step of rows whose next steps refresh the same parts (the reference's step)."""
        stack, s = Stack(model), block[0]
        batch, length = canvas.shape
        positions, mask, _ = stack.inputs(canvas, attention_mask, length, None)
        fresh = state is None or (self.refresh_at_block and block_step == 0)
        steps = (0,) * batch if fresh else tuple(n + 1 for n in state.step)
        step = steps[0]                  # the rows of one call are due alike
        p = s if state is None else state.gen_start
        if fresh:
            state = FeatureState([], [], [], [], p, (0,) * batch, *(torch.zeros(batch, dtype=torch.long,
                                                                                device=canvas.device),) * 2)
        prompt_due, gen_due = fresh or step % self.prompt_every == 0, fresh or step % self.gen_every == 0
        rope = stack.rope(positions)
        h = stack.embed(canvas)
        recompute = lambda layer, index: self._recompute(stack, layer, h, positions, mask, state, index)  # noqa: E731
        refreshed = torch.zeros(batch, dtype=torch.long, device=canvas.device)
        recomputed = torch.zeros_like(refreshed)
        for layer in range(stack.depth):
            full = (prompt_due and gen_due) or (layer == 0 and self.first_layer_full)
            if full:
                h = self._full(stack, layer, h, rope, mask, state, fresh)
                refreshed += 1
                continue
            spans = ([(0, p)] if prompt_due else []) + ([(p, length)] if gen_due else [])
            for a, b in spans:
                recompute(layer, torch.arange(a, b, device=h.device).expand(batch, -1))
            index = None
            if not gen_due and self.ratio > 0 and length > p:
                index = self._moved(stack, layer, h, state, p)
                recompute(layer, index)
            h = h + state.attn[layer]
            if index is not None or spans:
                rows = torch.cat([torch.arange(a, b, device=h.device).expand(batch, -1) for a, b in spans]
                                 + ([index] if index is not None else []), 1)
                at = rows[..., None].expand(-1, -1, h.shape[-1])
                state.ffn[layer] = state.ffn[layer].scatter(1, at, stack.ffn(layer, h.gather(1, at)))
            h = h + state.ffn[layer]
        gen = max(length - p, 0)
        partial = int(gen * self.ratio) if self.ratio > 0 else 0
        recomputed += (p if prompt_due else 0) + (gen if gen_due else partial)
        state.step, state.refreshed, state.recomputed = steps, refreshed, recomputed
        return stack.head(h[:, s:]), s, state

    def _full(self, stack: Stack, layer: int, h: Tensor, rope, mask: Tensor, state: FeatureState,
              fresh: bool) -> Tensor:
        """Every column of `layer`, stored; the layer's output."""
        q, k, v = stack.project(layer, h, rope)
        attn = stack.attend(layer, stack.probs(layer, q, k, mask), v, h.dtype)
        ffn = stack.ffn(layer, h + attn)
        if fresh:
            for store, value in zip((state.keys, state.values, state.attn, state.ffn), (k, v, attn, ffn)):
                store.append(value)
        else:
            state.keys[layer], state.values[layer], state.attn[layer], state.ffn[layer] = k, v, attn, ffn
        return h + attn + ffn

    def _recompute(self, stack: Stack, layer: int, h: Tensor, positions: Tensor, mask: Tensor,
                   state: FeatureState, index: Tensor) -> None:
        """Columns `index` (B, n) of `layer`: their keys and values, then their attention output
        over every column's keys (cached elsewhere), written into the state."""
        at = index[..., None].expand(-1, -1, h.shape[-1])
        q, k, v = stack.project(layer, h.gather(1, at), stack.rope(positions.gather(1, index)))
        where = index[:, None, :, None].expand_as(k)
        state.keys[layer] = state.keys[layer].scatter(2, where, k)
        state.values[layer] = state.values[layer].scatter(2, where, v)
        attn = stack.attend(layer, stack.probs(layer, q, state.keys[layer], mask), state.values[layer], h.dtype)
        state.attn[layer] = state.attn[layer].scatter(1, at, attn)

    def _moved(self, stack: Stack, layer: int, h: Tensor, state: FeatureState, p: int) -> Tensor:
        """(B, n) the response columns whose value vectors changed most (lowest cosine
        similarity with the cached ones); every response value is replaced by its new one."""
        new = stack.values(layer, h[:, p:])
        old = state.values[layer][:, :, p:]
        a, b = new.float(), old.float()
        # cosine over every head's values: the local heads' sums, then one all_reduce under TP,
        # so every rank picks the same columns (d2 and elastic reduce over heads the same way)
        sums = stack.head_sum(torch.stack([(a * b).sum((1, 3)), (a * a).sum((1, 3)), (b * b).sum((1, 3))]))
        sim = sums[0] / (sums[1] * sums[2]).clamp_min(1e-16).sqrt()
        # unchanged columns sit at 1.0 up to rounding, which differs with the summation order
        # (one process or TP ranks): rounded, they tie, and ties go to the lower column
        sim = (sim * 4096).round()
        state.values[layer] = torch.cat([state.values[layer][:, :, :p], new], 2)
        count = int(new.shape[2] * self.ratio)
        return sim.argsort(dim=-1, stable=True)[:, :count] + p

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        return state.select_rows(rows) if isinstance(state, FeatureState) else state

    def report(self, state: Any) -> dict[str, Tensor] | None:
        if not isinstance(state, FeatureState):
            return None
        return {"refreshed_layers": state.refreshed, "recomputed": state.recomputed}

    def trim(self, state: Any, width: int) -> Any:
        return state.trim(width) if isinstance(state, FeatureState) else state
