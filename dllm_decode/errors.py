"""Errors the library raises beyond `ValueError`/`TypeError` (no heavy imports: the CLI maps them)."""


class NonFiniteLogits(RuntimeError):
    """The model produced NaN or infinite logits: its weights, dtype or inputs are broken (no
    unmasking rule can decode that)."""
