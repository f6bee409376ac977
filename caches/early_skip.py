"""ES-dLLM: early-layer token skipping (Zhu et al., ICLR 2026, arXiv 2603.10088; code
zhuzj19/ES-dLLM@3c5151d, read at its stored snapshot 106125c: `generate.py` (`batch_generate`,
the forward range and the per-layer counts), `early_skipping.py` (`skip_in_hidden_state`,
`skip_in_qkv`, `get_importance_score`), `models/llada_func.py` (where a layer skips),
`config.py` (the defaults))."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from dllm_decode.caches.layerwise import Stack, check_model, confidence
from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Cache, DiffusionLM

SIGNALS = ("hidden", "key", "value", "query")
SCORE_GRID = 4096.0
"""Importance terms are rounded to multiples of 1/4096 before ranking, so that columns whose
terms differ only by float rounding (one process vs tensor-parallel ranks) tie, and ties go to
the lower column on every rank."""


def parse_proportions(text: str) -> tuple[tuple[float, float], ...]:
    """"1@0,0.5@0.125" -> ((1.0, 0.0), (0.5, 0.125)): (share kept, from this fraction of depth)."""
    try:
        pairs = tuple((float(p), float(s)) for p, s in (item.split("@") for item in text.split(",")))
    except ValueError:
        raise ValueError(f"proportions must read 'share@depth,...' such as '1@0,0.25@0.25', got {text!r}") from None
    if not pairs or pairs[0] != (1.0, 0.0):
        raise ValueError(f"proportions must start with 1@0 (every column enters layer 0), got {text!r}")
    for (p0, s0), (p1, s1) in zip(pairs, pairs[1:]):
        if not (s1 > s0 and 0.0 < p1 <= p0):
            raise ValueError(f"proportions need increasing depths and shares in (0, 1] that never grow, got {text!r}")
    if pairs[-1][1] > 1.0:
        raise ValueError(f"proportions' depths are fractions of the model's layers (<= 1), got {text!r}")
    return pairs


@dataclass
class SkipState:
    """Per layer the rotated keys and values (B, Hkv, L, D); per skip layer the signal kept of
    each column's last computation (B, L, X); each column's confidence at its last computation
    (B, L), 0 once decoded; the canvas of the last call; the first block's start and length; the
    last call's fresh window columns and counts."""

    keys: list[Tensor]
    values: list[Tensor]
    signals: dict[int, Tensor]
    conf: Tensor
    canvas: Tensor
    gen_start: int
    block_length: int
    fresh: Tensor | None
    refreshed: Tensor
    recomputed: Tensor

    def _map(self, rows, width) -> SkipState:
        cut = (lambda t, dim: t) if width is None else (lambda t, dim: t.narrow(dim, 0, min(width, t.shape[dim])))
        pick = (lambda t: t) if rows is None else (lambda t: t.index_select(0, rows.to(t.device)))
        both = lambda t, dim: cut(pick(t), dim)   # noqa: E731
        return SkipState([both(t, 2) for t in self.keys], [both(t, 2) for t in self.values],
                         {layer: both(t, 1) for layer, t in self.signals.items()}, both(self.conf, 1),
                         both(self.canvas, 1), self.gen_start, self.block_length,
                         None if self.fresh is None or rows is None else pick(self.fresh),
                         pick(self.refreshed), pick(self.recomputed))

    def select_rows(self, rows: Tensor) -> SkipState:
        return self._map(rows, None)

    def trim(self, width: int) -> SkipState:
        return self._map(None, width)


@dataclass
class Columns:
    """The columns a partial forward still carries at a layer: (B, n) canvas columns, which of
    them count for their row (a row keeping fewer than the batch's widest pads with its
    next-ranked columns, computed but never written), and their residual rows (B, n, d)."""

    index: Tensor
    valid: Tensor
    h: Tensor


class Pick(NamedTuple):
    """The columns a skip layer keeps: (B, k) canvas columns, which count for their row, and
    their places among the layer's columns."""

    index: Tensor
    valid: Tensor
    at: Tensor


@dataclass(frozen=True)
class EarlySkipCache(Cache):
    """Skip low-importance columns in the early layers: a dual-cache-like forward of the active
    block in which, at a few skip layers, only the most important columns continue; the others
    stop there and keep, in the later layers, the K/V of their last computation.

    Schedule (the reference's `batch_generate`, `step_cnt` = the block's offset from the first
    block plus the step within it):
      * the first call: every column through every layer, no skipping;
      * a prompt refresh (`step_cnt % prompt_every == 0`; 0 = the block length, so every block
        start): columns `[0, block end)` recomputed, no skipping; the masked suffix after the
        block keeps the K/V of the first call (`suffix = "stale"`, the reference) or is
        recomputed too (`suffix = "refresh"`);
      * otherwise the block `[start, end)` (at a block's first step, from the leftmost column
        committed at the previous step, the batch's minimum as the reference), skipping unless
        `step_cnt % full_every == 0`.
    Layer l keeps the share p_l of the forward's W columns, p_l the share of the last
    `proportions` entry with l >= depth x its fraction; skip layers are where p_l changes. A row
    keeps n_l = max(int(p_l W), min(commits at its last step + `min_extra`, block length)).
    With `signal = "hidden"` (the default) a skip layer runs on every column it receives and
    chooses after its FFN (`models/llada_func.py`): on LLaDA-8B's 32 layers, layers 0-4 run
    every column, 5-8 half, 9-31 a quarter; on the 4-layer embedded model layers 0-1 run every
    column and 2-3 a quarter (the 0.5 step falls between layers). `key`/`value`/`query`
    choose at the skip layer's projections, before its attention.
    Importance of a column at a skip layer:
        d = mean |x - x_prev| / (rms(x_prev) + 1e-6), x the signal (hidden output, or the
            rotated key/query or value of every head), x_prev its value at the column's last
            computation; d /= max(max over the row's columns, 1);
        S = alpha c + (1 - alpha) d, c the column's confidence at its last computation (0 once
            decoded); + `bonus_top2` on the two highest c (alpha > 0); + `bonus_frontier` on the
            row's leftmost masked column of the block; + `bonus_decoded` on the columns
            committed at the last step (alpha < 1). The top n_l by S continue.
    Only columns that reach the last layer get logits; `fresh` names them, so the loop commits
    nowhere else (the others' window logits are zeros). The frontier bonus keeps every busy row's
    leftmost masked column among them whenever n_l exceeds the last step's commits.

    Defaults: the reference's `config.py`: proportions `1@0,0.5@0.125,0.25@0.25`, alpha 0.5,
    `HiddenState`, `block_update_freq = 64`, `prompt_update_freq = block_length`; the bonuses
    5, 3, 2 and the `+ 2` of the count are constants in `generate.py`/`early_skipping.py`.

    Deviations: per-row counts (the reference uses the batch's largest commit count; its
    per-layer count is one Python int); the bonuses are one scatter each (no row loop);
    importance terms rounded to 1/4096 and ties to the lower column (the reference's
    `topk(sorted=False)` leaves ties to the kernel), for tensor-parallel exactness; c is the
    plain top probability with [MASK] excluded (the reference zeroes an end-of-text candidate
    right after a mask in its own sampler, a rule outside this cache); float32 attention
    (`caches/layerwise.py`) and padding never attended; `suffix = "refresh"` added (an
    approximation beyond the paper in the reference: the suffix's K/V stay those of the first
    call); the block length is the first call's window width; Sparse-dLLM (`sparse_kv`) and CFG
    not ported. LLaDA layout only (`caches/layerwise.py`); other families are refused in one line.
    Its refresh schedule counts from the batch's first call (one state per batch), so a running
    batch takes no newcomer mid-run (`mid_run_joins`; the engine starts another running batch).
    No skipping (`proportions = "1@0"`) with `suffix = "refresh"` is the `dual` cache; with
    `prompt_every = 1` too, every step is a full forward: `none`.
    """

    capturable: ClassVar[bool] = False    # columns chosen from the data each step: always eager
    mid_run_joins: ClassVar[bool] = False  # its refresh steps count from the batch's first call

    proportions: str = "1@0,0.5@0.125,0.25@0.25"
    alpha: float = 0.5
    signal: str = "hidden"
    full_every: int = bounded(64, most=MAX_CANVAS, scales="steps")
    prompt_every: int = bounded(0, most=MAX_CANVAS, scales="steps")
    bonus_frontier: float = 5.0
    bonus_decoded: float = 3.0
    bonus_top2: float = 2.0
    min_extra: int = bounded(2, most=MAX_CANVAS, scales="memory")
    suffix: str = "stale"

    def __post_init__(self) -> None:
        parse_proportions(self.proportions)
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}, got {self.signal!r}")
        if self.suffix not in ("stale", "refresh"):
            raise ValueError(f"suffix must be 'stale' or 'refresh', got {self.suffix!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1] (0: change alone, 1: confidence alone), got {self.alpha}")
        if self.full_every < 1:
            raise ValueError(f"full_every must be >= 1 (1: no skipping), got {self.full_every}")
        if self.prompt_every < 0:
            raise ValueError(f"prompt_every must be >= 0 (0: the block length), got {self.prompt_every}")
        if self.min_extra < 0:
            raise ValueError(f"min_extra must be >= 0, got {self.min_extra}")

    def init_state(self, model: DiffusionLM) -> None:
        check_model(model, "es")
        return None

    def shares(self, depth: int) -> list[float]:
        """p_l per layer: the share of the last (p, s) with l >= s x depth."""
        pairs = parse_proportions(self.proportions)
        return [[p for p, s in pairs if layer >= s * depth][-1] for layer in range(depth)]

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any) -> tuple[Tensor, int, Any]:
        stack, (s, e) = Stack(model), block
        batch, length = canvas.shape
        positions, mask, masked = stack.inputs(canvas, attention_mask, length, None)
        shares = self.shares(stack.depth)
        skips = {layer for layer in range(stack.depth) if shares[layer] != (shares[layer - 1] if layer else 1.0)}
        decoded = torch.zeros_like(masked)
        if state is None:
            state = SkipState([], [], {}, torch.zeros(batch, length, device=canvas.device), canvas,
                              s, e - s, None, *(torch.zeros(batch, dtype=torch.long, device=canvas.device),) * 2)
            a, b, full, skipping = 0, length, True, False
        else:
            decoded = (state.canvas == model.mask_token_id) & ~masked
            state.conf = state.conf.masked_fill(~masked, 0.0)        # decoded columns score 0
            count = (s - state.gen_start) + block_step
            prompt = count % (self.prompt_every or state.block_length) == 0
            skipping = not prompt and count % self.full_every != 0
            a, b, full = 0 if prompt else s, length if prompt and self.suffix == "refresh" else e, prompt
        commits = decoded.sum(-1)
        if not full and block_step == 0:    # refresh the K/V of the last step's commits once
            columns = torch.arange(length, device=canvas.device)
            a = min(a, int(torch.where(decoded, columns, length).min()))
        lo, hi = (s, b) if b == length else (s, e)
        index = torch.arange(a, b, device=canvas.device).expand(batch, -1)
        cols = Columns(index, torch.ones_like(index, dtype=torch.bool), stack.embed(canvas.gather(1, index)))
        bonus = self._bonus(masked, decoded, s, e) if skipping else None
        counts = self._counts(commits, shares, b - a, e - s) if skipping else None
        for layer in range(stack.depth):
            choose = skipping and layer in skips
            cols = self._layer(stack, layer, cols, positions, mask, state, layer in skips, bonus,
                               counts[layer] if choose else None)
        keep = cols.valid & (cols.index >= lo) & (cols.index < hi)
        logits, fresh = self._window(stack, cols, keep, lo, hi - lo, full, a)
        self._remember(state, logits[:, :e - lo], fresh[:, :e - lo], masked[:, lo:e], lo, model.mask_token_id)
        whole = min(skips) + (self.signal == "hidden") if skipping and skips else stack.depth
        state.canvas, state.fresh = canvas.clone(), fresh
        state.refreshed, state.recomputed = torch.full_like(commits, whole), keep.sum(-1)
        return logits, lo, state

    def _counts(self, commits: Tensor, shares: list[float], width: int,
                block_length: int) -> list[tuple[Tensor, int]]:
        """Per layer, (B,) columns each row keeps, max(int(p_l W), min(commits + min_extra,
        block)), and the batch's largest (one host read per step)."""
        floor = (commits + self.min_extra).clamp_max(block_length)
        most = int(floor.max())
        return [(floor.clamp_min(int(p * width)).clamp_max(width), min(max(int(p * width), most), width))
                for p in shares]

    def _bonus(self, masked: Tensor, decoded: Tensor, s: int, e: int) -> Tensor:
        """(B, L) constant terms: the frontier bonus on each row's leftmost masked column of the
        block, the decoded bonus on the last step's commits (alpha < 1)."""
        batch, length = masked.shape
        columns = torch.arange(length, device=masked.device)
        in_block = masked & (columns >= s) & (columns < e)
        bonus = torch.zeros(batch, length + 1, device=masked.device)
        first = torch.where(in_block, columns, length).amin(-1, keepdim=True)   # length: no mask left
        bonus.scatter_(1, first, self.bonus_frontier)
        bonus = bonus[:, :length]
        if self.alpha < 1.0:
            bonus = bonus + decoded.float() * self.bonus_decoded
        return bonus

    def _layer(self, stack: Stack, layer: int, cols: Columns, positions: Tensor, mask: Tensor,
               state: SkipState, skip: bool, bonus: Tensor | None,
               counts: tuple[Tensor, int] | None) -> Columns:
        """One layer over `cols`. A skip layer keeps its signal of every column it computes and,
        given `counts`, lets only the chosen columns continue. K/V and signals are written only
        for the valid columns."""
        rope = stack.rope(positions.gather(1, cols.index))
        q, k, v = stack.project(layer, cols.h, rope)
        if self.signal != "hidden" and skip:
            signal = {"key": k, "value": v, "query": q}[self.signal]
            flat = signal.transpose(1, 2).flatten(2)
            if counts is not None:
                kept = self._kept(state, layer, cols.index, flat)
                pick = self._choose(cols, self._change(stack, flat, kept, True), state.conf, bonus, counts)
                cols = Columns(pick.index, pick.valid, cols.h.gather(1, _rows(pick.at, cols.h)))
                q, k, v = (t.gather(2, pick.at[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3]))
                           for t in (q, k, v))
                flat = flat.gather(1, _rows(pick.at, flat))
            self._store(state, layer, cols, flat)
        self._write(state, layer, cols, k, v)
        p = stack.probs(layer, q, state.keys[layer], mask)
        h = stack.finish(layer, cols.h, p, state.values[layer])
        cols = Columns(cols.index, cols.valid, h)
        if self.signal == "hidden" and skip:
            if counts is not None:
                kept = self._kept(state, layer, cols.index, h)
                pick = self._choose(cols, self._change(stack, h, kept, False), state.conf, bonus, counts)
                cols = Columns(pick.index, pick.valid, h.gather(1, _rows(pick.at, h)))
            self._store(state, layer, cols, cols.h)
        return cols

    @staticmethod
    def _kept(state: SkipState, layer: int, index: Tensor, like: Tensor) -> Tensor:
        kept = state.signals.get(layer)
        if kept is None:                    # never computed: the reference compares with zeros
            return torch.zeros_like(like)
        return kept.gather(1, _rows(index, kept))

    @staticmethod
    def _change(stack: Stack, x: Tensor, kept: Tensor, by_head: bool) -> Tensor:
        """(B, n) mean |x - kept| / (rms(kept) + 1e-6) over the last dimension; `by_head`: `x`
        holds this rank's heads only, so the sums are taken over every rank's (one all_reduce)."""
        sums = torch.stack([(x.float() - kept.float()).abs().sum(-1), kept.float().pow(2).sum(-1)])
        width = x.shape[-1]
        if by_head:
            sums, width = stack.head_sum(sums), width * stack.tp
        return (sums[0] / width) / ((sums[1] / width).sqrt() + 1e-6)

    def _choose(self, cols: Columns, change: Tensor, conf: Tensor, bonus: Tensor,
                counts: tuple[Tensor, int]) -> Pick:
        """The top `counts` columns of each row by importance (`change`: the signal's, since each
        column's last computation), in column order."""
        change = change.masked_fill(~cols.valid, 0.0)
        change = change / change.amax(-1, keepdim=True).clamp_min(1.0)
        c = conf.gather(1, cols.index)
        change, c = (change * SCORE_GRID).round() / SCORE_GRID, (c * SCORE_GRID).round() / SCORE_GRID
        score = self.alpha * c + (1.0 - self.alpha) * change
        if self.alpha > 0.0:
            order = _ranked(c.masked_fill(~cols.valid, -1.0), cols.index)[:, :2]
            score = score + torch.zeros_like(score).scatter(1, order, self.bonus_top2)
        score = (score + bonus.gather(1, cols.index)).masked_fill(~cols.valid, float("-inf"))
        counts, widest = counts
        at = _ranked(score, cols.index)[:, :widest]
        at = at.gather(1, cols.index.gather(1, at).argsort(dim=-1))              # back in column order
        rank = _ranked(score, cols.index).argsort(dim=-1).gather(1, at)          # each pick's rank
        return Pick(cols.index.gather(1, at), rank < counts[:, None], at)

    @staticmethod
    def _store(state: SkipState, layer: int, cols: Columns, x: Tensor) -> None:
        kept = state.signals.get(layer)
        if kept is None:
            kept = x.new_zeros(x.shape[0], state.canvas.shape[1], x.shape[2])
        old = kept.gather(1, _rows(cols.index, kept))
        state.signals[layer] = kept.scatter(1, _rows(cols.index, kept), torch.where(cols.valid[..., None], x, old))

    @staticmethod
    def _write(state: SkipState, layer: int, cols: Columns, k: Tensor, v: Tensor) -> None:
        if len(state.keys) <= layer:
            length = state.canvas.shape[1]
            state.keys.append(k.new_zeros(k.shape[0], k.shape[1], length, k.shape[3]))
            state.values.append(v.new_zeros(v.shape[0], v.shape[1], length, v.shape[3]))
        at = cols.index[:, None, :, None].expand_as(k)
        for store, new in ((state.keys, k), (state.values, v)):
            old = store[layer].gather(2, at)
            store[layer] = store[layer].scatter(2, at, torch.where(cols.valid[:, None, :, None], new, old))

    @staticmethod
    def _window(stack: Stack, cols: Columns, keep: Tensor, lo: int, width: int, full: bool,
                a: int) -> tuple[Tensor, Tensor]:
        """(B, width, V) logits of the window from canvas column `lo` (zeros where no column
        reached the last layer) and (B, width) bool: which did. `full`: `cols` are the
        contiguous columns from `a`."""
        batch = cols.index.shape[0]
        if full:
            logits = stack.head(cols.h[:, lo - a:lo - a + width])
            return logits, torch.ones(batch, width, dtype=torch.bool, device=logits.device)
        logits = stack.head(cols.h)
        out = logits.new_zeros(batch, width + 1, logits.shape[-1])
        place = torch.where(keep, cols.index - lo, width)                    # width: a discarded slot
        out = out.scatter(1, place[..., None].expand_as(logits), logits)
        fresh = torch.zeros(batch, width + 1, dtype=torch.bool, device=keep.device).scatter(1, place, keep)
        return out[:, :width], fresh[:, :width]

    @staticmethod
    def _remember(state: SkipState, logits: Tensor, fresh: Tensor, masked: Tensor, lo: int,
                  mask_id: int) -> None:
        """Each fresh block column's confidence (0 where decoded), as the reference keeps it for
        the block's columns only: `logits`, `fresh`, `masked` cover the block from `lo`."""
        c = confidence(logits, mask_id).masked_fill(~masked, 0.0)
        window = slice(lo, lo + logits.shape[1])
        state.conf[:, window] = torch.where(fresh, c, state.conf[:, window])

    def fresh(self, state: Any) -> Tensor | None:
        return state.fresh if isinstance(state, SkipState) else None

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        return state.select_rows(rows) if isinstance(state, SkipState) else state

    def report(self, state: Any) -> dict[str, Tensor] | None:
        if not isinstance(state, SkipState):
            return None
        return {"refreshed_layers": state.refreshed, "recomputed": state.recomputed}

    def trim(self, state: Any, width: int) -> Any:
        return state.trim(width) if isinstance(state, SkipState) else state


def _rows(index: Tensor, like: Tensor) -> Tensor:
    """`index` (B, n) expanded over `like`'s last dimension, for gather/scatter on dim 1."""
    return index[..., None].expand(-1, -1, like.shape[-1])


def _ranked(score: Tensor, columns: Tensor) -> Tensor:
    """(B, n) places in descending `score`, ties to the lower canvas column."""
    by_column = columns.argsort(-1)
    order = score.gather(1, by_column).argsort(dim=-1, descending=True, stable=True)
    return by_column.gather(1, order)
