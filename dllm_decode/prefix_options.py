"""The prefix cache's start-up options, checked as a whole (`Engine(prefix_cache_bytes=)`,
`serve --prefix-cache-bytes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dllm_decode.fields import MAX_CANVAS, Checked, bounded

if TYPE_CHECKING:                     # torch stays out of `serve --help`
    from dllm_decode.prefix_reuse import PrefixSharing

MAX_PREFIX_BYTES = 1 << 40
"""The largest prefix-cache budget (1 TiB): past any device's memory."""


@dataclass(frozen=True)
class PrefixOptions(Checked):
    """The cross-request prefix cache's settings.

    Attributes:
        budget_bytes: the most bytes its stored K/V may take, per rank under tensor parallelism
            (0: off).
        capture: the engine's capture mode (the cache seeds the eager step only).
        causal_lm: the engine serves a causal LM (which keeps its own KV cache per request).
        approximate: > 0 opts in to approximate reuse (`prefix_reuse.PrefixReuse`) in chunks of
            this many tokens, for caches that declare it (the `prefix` cache); 0: exact only.
        keeps_kv: the model keeps K/V the cache can store (`supports_kv`, or a causal
            encoder's: `encoder_reuse`); for one that keeps none (a transformers masked LM) a
            budget is refused.
    Raises:
        ValueError: a negative or too large budget or chunk; a budget with a capture mode other
            than "off", for a causal LM or a model without K/V; a chunk without a budget.
    """

    budget_bytes: int = bounded(0, most=MAX_PREFIX_BYTES, scales="memory")
    capture: Any = "off"
    causal_lm: bool = False
    approximate: int = bounded(0, most=MAX_CANVAS)
    keeps_kv: bool = True

    def __post_init__(self) -> None:
        if self.budget_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0 (0: off), got {self.budget_bytes}")
        if self.approximate < 0:
            raise ValueError(f"prefix_cache_approximate must be >= 0 (0: exact reuse only), got {self.approximate}")
        if self.approximate and not self.budget_bytes:
            raise ValueError("prefix_cache_approximate needs a prefix cache: set prefix_cache_bytes too")
        if not self.budget_bytes:
            return
        mode = getattr(self.capture, "mode", self.capture)
        if mode != "off":
            raise ValueError(f"the prefix cache seeds the eager step: it cannot run with capture "
                             f"{mode!r} (use capture 'off', or prefix_cache_bytes 0)")
        if self.causal_lm:
            raise ValueError("the prefix cache serves diffusion models; a causal LM keeps its own "
                             "KV cache per request (use prefix_cache_bytes 0)")
        if not self.keeps_kv:
            raise ValueError("the prefix cache stores a model's K/V, and this model keeps none "
                             "(supports_kv is False); use prefix_cache_bytes 0")

    def sharing(self) -> PrefixSharing | None:
        """The engine's prefix cache, or None when off."""
        from dllm_decode.prefix_reuse import PrefixSharing

        return PrefixSharing(self.budget_bytes, self.approximate) if self.budget_bytes else None
