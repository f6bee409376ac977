"""Model implementations (plain torch) and the loader that picks one from `config.json`."""

from dllm_decode.models.dream import DreamConfig, DreamModel
from dllm_decode.models.hf import HFMaskedLM
from dllm_decode.models.layers import KVCache
from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM
from dllm_decode.models.checkpoint import ModelLoadError, load_tokenizer
from dllm_decode.models.loading import load_model

__all__ = ["DreamConfig", "DreamModel", "HFMaskedLM", "KVCache", "LLaDAConfig", "LLaDAModelLM",
           "ModelLoadError", "load_model", "load_tokenizer"]
