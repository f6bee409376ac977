"""The Learn2PD filter's training, behind `dllm-decode train-filter`: decoding traces turned into
per-slot step data (`steps`), on-policy rollouts (`onpolicy`), the fit and its metrics (`filter`),
and the side-by-side table of decoders on the task suite (`side_by_side`).

The recipes that trained the embedded models are not installed: `recipes/` at the repository root.
"""

__all__: list[str] = []
