"""Model implementations (plain torch) and the loader that picks one from `config.json`."""

from dllm_decode.models.layers import KVCache
from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM
from dllm_decode.models.loading import ModelLoadError, load_model, load_tokenizer

__all__ = ["KVCache", "LLaDAConfig", "LLaDAModelLM", "ModelLoadError", "load_model", "load_tokenizer"]
