"""Rules applied after the scheduler: learned commit filters and end-of-text truncation."""

from dllm_decode.interfaces import Filter

FILTERS: dict[str, type[Filter]] = {}

__all__ = ["FILTERS"]
