"""Training recipes for the embedded models, kept out of the installed wheel: run them from the
repository root, `python -m recipes.dllm` (masked diffusion, LLaDA architecture),
`python -m recipes.ar` (Llama-format target and draft), `python -m recipes.bd` (block diffusion:
the AR target converted with Fast-dLLM v2's recipe) and `python -m recipes.dparallel` (dParallel
certainty distillation). `README.md` here gives the runs and their measured accuracies.

What `dllm-decode train-filter` needs (the Learn2PD filter's data collection and fit) is part of
the package: `dllm_decode.eval.training`.
"""

__all__: list[str] = []
