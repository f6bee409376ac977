"""How the loop obtains logits for the active block: none, prefix, dual, block, d2, elastic, suffix,
dllm_cache, dkv, es."""

from dllm_decode._namespace import require_namespaced

require_namespaced(__name__)

from dllm_decode.caches.block import BlockCache
from dllm_decode.caches.d2 import D2Cache
from dllm_decode.caches.dkv import DKVCache
from dllm_decode.caches.dllm_cache import DLLMCache
from dllm_decode.caches.dual import DualCache
from dllm_decode.caches.early_skip import EarlySkipCache
from dllm_decode.caches.elastic import ElasticCache
from dllm_decode.caches.kv import BlockKVCache
from dllm_decode.caches.prefix import PrefixCache
from dllm_decode.caches.suffix import SuffixCache
from dllm_decode.interfaces import Cache, NoCache

CACHES: dict[str, type[Cache]] = {
    "none": NoCache,        # full forward every step (exact; the default, defined in core)
    "prefix": PrefixCache,  # Fast-dLLM PrefixCache: block + suffix recomputed, prefix K/V cached
    "dual": DualCache,      # Fast-dLLM DualCache: block recomputed, prefix and suffix K/V cached
    "block": BlockCache,    # block-diffusion models: finished blocks' K/V cached, exact
    "d2": D2Cache,          # d2Cache: block + chosen masks and rollout-selected tokens recomputed
    "elastic": ElasticCache,  # Elastic-Cache: block recomputed, deeper layers refreshed on drift
    "suffix": SuffixCache,  # Streaming-dLLM window / DPad dropout over the masked suffix
    "dllm_cache": DLLMCache,  # dLLM-Cache: long-interval prompt cache + value-similarity partial response refresh
    "dkv": DKVCache,        # dKV-Cache-Decode: masks and just-decoded columns recomputed, the rest cached
    "es": EarlySkipCache,   # ES-dLLM: block recomputed, low-importance columns stop at early skip layers
}

__all__ = ["CACHES", "BlockCache", "BlockKVCache", "D2Cache", "DKVCache", "DLLMCache", "DualCache", "EarlySkipCache", "ElasticCache", "NoCache",
           "PrefixCache", "SuffixCache"]
