"""Suffix pruning: Streaming-dLLM's window over the masked suffix (arXiv 2601.17917) and DPad's
distance-decay suffix dropout (arXiv 2508.14148)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Cache, DiffusionLM
from dllm_decode.models.layers import KVCache, default_positions

MODES = ("window", "dpad")
INNER = ("none", "prefix", "dual")


@dataclass
class SuffixState:
    """The kept canvas columns of the active block (1-D, shared by the rows), the block they were
    drawn for, the K/V of the pruned canvas, and the step's counts."""

    columns: Tensor
    block: tuple[int, int]
    kv: KVCache | None
    refreshed: Tensor
    recomputed: Tensor

    def select_rows(self, rows: Tensor) -> SuffixState:
        kv = self.kv.select_rows(rows) if self.kv is not None and self.kv.filled else self.kv
        return SuffixState(self.columns, self.block, kv, self.refreshed.index_select(0, rows),
                           self.recomputed.index_select(0, rows))


@dataclass(frozen=True)
class SuffixCache(Cache):
    """Decode each block on a pruned canvas: everything up to the block end, plus part of the
    masked suffix, every kept token at its original position. Works with every scheduler.

    `mode="window"` (Streaming-dLLM, `LLaDA-1.5/generate.py generate_with_prefix_cache`): keep the
    first `window` suffix columns and the last canvas column (`tail_keep`).
    `mode="dpad"` (DPad, `llada/generate_dropout.py`, Gaussian variant): at each block start keep
    suffix offset d (0-based from the block end) with probability `scale * phi(x_d)`,
    `x_d = linspace(0, k, dpad_window)[d]`, phi the standard normal pdf, none beyond `dpad_window`.

    The pruned canvas is then decoded through `kv`: `none` (the default, DPad's plain setting: a
    full forward of the pruned canvas every step), `prefix` (Streaming-dLLM's: one full forward of
    the pruned canvas at the block start, then the block and the kept suffix against the cached
    prefix K/V) or `dual` (then the block rows only). The first step of every block is a full
    forward, so it also refreshes whenever the loop's block changes. The default is `none`
    because on the small embedded model a stale prefix costs accuracy (as the plain prefix cache
    does, `eval/bench/cache.py`); `suffix:kv=prefix` is Streaming-dLLM's full setting.

    Deviations: Streaming-dLLM's dynamic threshold (`confidence_alpha`) is a scheduler matter, not
    applied here (use any scheduler); DPad's one random draw per block comes from this cache's
    own generator seeded with (`seed`, distance of the block end from the canvas end), shared by
    every row (as the reference's one draw per block), so a batch decodes like each prompt alone
    and runs repeat; early termination at EOS is the loop's `stop_at_eos`. Changes the input
    (the pruned canvas is a shorter input, not an approximation of the full forward), so not
    exact; with a window covering the canvas and `kv=none` it equals `none`. The kept columns
    follow the batch's shared block end, which a newcomer in an earlier block would move for
    itself, so a running batch takes no newcomer mid-run (`mid_run_joins`).

    Attributes:
        mode: "window" or "dpad".
        window: window mode: suffix columns kept (Streaming-dLLM: 96 for most tasks at gen 256).
        tail_keep: window mode: last canvas columns kept (Streaming-dLLM: 1).
        k, scale, dpad_window: dpad mode (DPad GSM8K: 4.0, 2.0, 256).
        kv: "none", "prefix" or "dual": how the pruned canvas is cached inside a block.
        seed: dpad mode: the draws' seed.
    """

    capturable: ClassVar[bool] = False    # rows chosen from the data each step: always eager
    mid_run_joins: ClassVar[bool] = False  # the kept columns follow the batch's shared block end

    mode: str = "window"
    window: int = bounded(96, most=MAX_CANVAS, scales="memory")
    tail_keep: int = bounded(1, most=MAX_CANVAS, scales="memory")
    k: float = 4.0
    scale: float = 2.0
    dpad_window: int = bounded(256, most=MAX_CANVAS, scales="memory")
    kv: str = "none"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.kv not in INNER:
            raise ValueError(f"kv must be one of {list(INNER)}, got {self.kv!r}")
        for name in ("window", "tail_keep", "dpad_window"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.k <= 0 or self.scale <= 0:
            raise ValueError(f"k and scale must be > 0, got k={self.k}, scale={self.scale}")

    def init_state(self, model: DiffusionLM) -> None:
        if self.kv != "none" and not getattr(model, "supports_kv", False):
            name = getattr(model, "name_or_path", None) or type(model).__name__
            raise ValueError(f"cache suffix with kv={self.kv} needs a model with a KV cache, and "
                             f"{name} has none (supports_kv is False); accepted: suffix:kv=none or 'none'")
        return None

    def kept(self, block_end: int, length: int, device: torch.device) -> Tensor:
        """(n,) sorted canvas columns kept while the block ending at `block_end` decodes."""
        suffix = length - block_end
        if self.mode == "window":
            offsets = torch.arange(min(self.window, suffix), device=device)
            tail = torch.arange(max(suffix - self.tail_keep, len(offsets)), suffix, device=device)
            offsets = torch.cat([offsets, tail])
        else:
            width = min(self.dpad_window, suffix)
            x = torch.linspace(0, self.k, self.dpad_window)[:width]
            keep_prob = self.scale * torch.exp(-0.5 * x ** 2) / math.sqrt(2 * math.pi)
            draw = torch.Generator().manual_seed(self.seed * 1_000_003 + suffix)
            offsets = torch.nonzero(torch.rand(width, generator=draw) < keep_prob).flatten().to(device)
        return torch.cat([torch.arange(block_end, device=device), block_end + offsets])

    def logits(self, model: DiffusionLM, canvas: Tensor, attention_mask: Tensor | None,
               block: tuple[int, int], block_step: int, state: Any) -> tuple[Tensor, int, Any]:
        s, e = block
        batch, length = canvas.shape
        fresh = state is None or state.block != block or block_step == 0
        if fresh:
            state = SuffixState(self.kept(e, length, canvas.device), block,
                                None if self.kv == "none" else KVCache.for_model(model), canvas.new_zeros(batch),
                                canvas.new_zeros(batch))
        cols = state.columns
        positions = default_positions(attention_mask, batch, length, canvas.device).index_select(1, cols)
        mask = None if attention_mask is None else attention_mask.index_select(1, cols)
        pruned = canvas.index_select(1, cols)
        width = len(cols)
        rows = (s, width) if fresh or self.kv != "dual" else (s, e)
        logits = model(pruned, mask, positions, kv=state.kv, rows=rows)
        fed = width if fresh or self.kv == "none" else rows[1] - rows[0]
        state.recomputed = torch.full((batch,), fed, dtype=torch.long, device=canvas.device)
        depth = len(model.parts()[1]) if hasattr(model, "parts") else 1
        state.refreshed = torch.full_like(state.recomputed, depth if fresh or self.kv == "none" else 0)
        return logits[:, :e - s], s, state

    def select_rows(self, state: Any, rows: Tensor) -> Any:
        return state.select_rows(rows) if isinstance(state, SuffixState) else state

    def report(self, state: Any) -> dict[str, Tensor] | None:
        if not isinstance(state, SuffixState):
            return None
        return {"refreshed_layers": state.refreshed, "recomputed": state.recomputed}

    def trim(self, state: Any, width: int) -> Any:
        return None                                      # the next step draws and fills afresh
