"""Training recipes for the embedded models: `python -m eval.training.dllm` (masked diffusion,
LLaDA architecture) and `python -m eval.training.ar` (Llama-format target and draft)."""

__all__: list[str] = []
