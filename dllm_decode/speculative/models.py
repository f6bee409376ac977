"""The old import path of causal-LM loading, now `dllm_decode.models.causal` (kept so callers
outside the speculative package keep working; import from `dllm_decode.models.causal`)."""

from dllm_decode.models.causal import EMBEDDED_AR, build_causal, load_causal_lm, resolve_causal_dir

__all__ = ["EMBEDDED_AR", "build_causal", "load_causal_lm", "resolve_causal_dir"]
