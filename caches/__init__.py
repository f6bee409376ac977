"""How the loop obtains logits for the active block: none, prefix, dual, block."""

from dllm_decode._namespace import require_namespaced

require_namespaced(__name__)

from dllm_decode.caches.block import BlockCache
from dllm_decode.caches.dual import DualCache
from dllm_decode.caches.kv import BlockKVCache
from dllm_decode.caches.prefix import PrefixCache
from dllm_decode.interfaces import Cache, NoCache

CACHES: dict[str, type[Cache]] = {
    "none": NoCache,        # full forward every step (exact; the default, defined in core)
    "prefix": PrefixCache,  # Fast-dLLM PrefixCache: block + suffix recomputed, prefix K/V cached
    "dual": DualCache,      # Fast-dLLM DualCache: block recomputed, prefix and suffix K/V cached
    "block": BlockCache,    # block-diffusion models: finished blocks' K/V cached, exact
}

__all__ = ["CACHES", "BlockCache", "BlockKVCache", "DualCache", "NoCache", "PrefixCache"]
