"""Fast-dLLM's PrefixCache (`generate_with_prefix_cache`)."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_decode.caches.kv import BlockKVCache


@dataclass(frozen=True)
class PrefixCache(BlockKVCache):
    """Cache the K/V before the block; every step recomputes the block and everything after it.

    Each step feeds canvas rows `[s, L)` against the prefix K/V `[0, s)` stored by the last
    refresh (Wu et al., 2025, arXiv 2505.22618, §3.2). Approximate with two or more layers: the
    prefix tokens do not change inside a block, but their K/V at layers >= 1 were computed while
    the block was still masked. Exact with one layer, or with `refresh_every=1`.

    Deviation from the reference: the fresh K/V of rows `[s, L)` are written into the cache
    (the reference discards them); the next step recomputes those rows anyway, so the logits
    are the same.
    """

    def rows(self, block: tuple[int, int], length: int) -> tuple[int, int]:
        return block[0], length
