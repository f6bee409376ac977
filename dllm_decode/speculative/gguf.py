"""The old import path of the GGUF source, now `dllm_decode.models.gguf` (kept so callers
outside the speculative package keep working; import from `dllm_decode.models.gguf`)."""

from dllm_decode.models.gguf import (WHEEL_MODELS, FetchError, WheelModel, cache_dir, fetch,
                                     gguf_path, load_gguf)

__all__ = ["WHEEL_MODELS", "FetchError", "WheelModel", "cache_dir", "fetch", "gguf_path", "load_gguf"]
