"""How the loop obtains logits for the active block: none, prefix, dual."""

from caches.none import NoCache
from dllm_decode.interfaces import Cache

CACHES: dict[str, type[Cache]] = {
    "none": NoCache,      # full forward every step (exact)
}

__all__ = ["CACHES", "NoCache"]
