"""Training recipes for the embedded models: `python -m dllm_decode.eval.training.dllm` (masked diffusion,
LLaDA architecture), `python -m dllm_decode.eval.training.ar` (Llama-format target and draft) and
`python -m dllm_decode.eval.training.bd` (block diffusion: the AR target converted with Fast-dLLM v2's
recipe)."""

__all__: list[str] = []
