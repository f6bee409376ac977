"""Model implementations (plain torch) and the loaders: `load_model` picks a diffusion family
from `config.json`, `load_causal_lm` loads a causal LM for the AR / speculative mode."""

from dllm_decode.models.compact import DLLM_RUNTIMES, set_runtime
from dllm_decode.models.dream import DreamConfig, DreamModel
from dllm_decode.models.fast_dllm import FastDLLMConfig, FastDLLMLlamaConfig, FastDLLMModel
from dllm_decode.models.hf import HFMaskedLM
from dllm_decode.models.layers import KVCache
from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM
from dllm_decode.models.llada2 import LLaDA2Config, LLaDA2Model
from dllm_decode.models.sdar import SDARConfig, SDARModel
from dllm_decode.models.causal import load_causal_lm
from dllm_decode.models.checkpoint import ModelLoadError, load_tokenizer
from dllm_decode.models.loading import load_model

__all__ = ["DLLM_RUNTIMES", "DreamConfig", "DreamModel", "FastDLLMConfig", "FastDLLMLlamaConfig", "FastDLLMModel",
           "HFMaskedLM", "KVCache", "LLaDA2Config", "LLaDA2Model", "LLaDAConfig", "LLaDAModelLM",
           "ModelLoadError", "SDARConfig", "SDARModel", "load_causal_lm", "load_model", "load_tokenizer",
           "set_runtime"]
