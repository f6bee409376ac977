"""Fast-dLLM's DualCache (`generate_with_dual_cache`), with dInfer's vicinity window."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.caches.kv import BlockKVCache


@dataclass(frozen=True)
class DualCache(BlockKVCache):
    """Cache the K/V of the prefix and the suffix; every step recomputes only the block rows.

    Each step feeds the block rows `[s, e)`, writes their fresh K/V over the cached ones in place
    (the integer-range form of `replace_position`, batch-safe, no host sync) and attends over the
    whole canvas (Wu et al., 2025, arXiv 2505.22618, §3.2). Approximate with two or more layers:
    prefix and suffix K/V at layers >= 1 come from the last refresh. Exact with one layer (the
    suffix stays [MASK] inside a block), or with `refresh_every=1`.

    Under the dual cache a step's logits cover the block only, also for schedulers that ask for
    the rest of the canvas (`view = "rest"`); the refresh step covers the rest.

    Attributes:
        prefix_look, after_look: dInfer's vicinity refresh (`inclusionAI/dInfer`): also
            recompute `prefix_look` rows before the block and `after_look` rows after it each step.
            Deviation: their fresh K/V stay in the cache (dInfer uses them for that forward only).
            A `prefix_look` at least the canvas length recomputes everything before the block
            end and caches only the suffix: on the small embedded model, whose prompt positions
            track what the answer already holds, that kept most of the uncached decode's task
            accuracy where the default lost it (`dllm-decode bench cache --variant
            dual:prefix_look=1024` measures both).
    """

    prefix_look: int = bounded(0, most=MAX_CANVAS, scales="memory")
    after_look: int = bounded(0, most=MAX_CANVAS, scales="memory")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("prefix_look", "after_look"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def rows(self, block: tuple[int, int], length: int) -> tuple[int, int]:
        return max(block[0] - self.prefix_look, 0), min(block[1] + self.after_look, length)
