"""Training recipes for the embedded models: `python -m dllm_decode.eval.training.dllm` (masked diffusion,
LLaDA architecture) and `python -m dllm_decode.eval.training.ar` (Llama-format target and draft)."""

__all__: list[str] = []
