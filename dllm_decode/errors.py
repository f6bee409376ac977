"""Errors the library raises beyond `ValueError`/`TypeError` (no heavy imports: the CLI maps them)."""


class NonFiniteLogits(RuntimeError):
    """The model produced NaN or infinite logits: its weights, dtype or inputs are broken (no
    unmasking rule can decode that)."""


class UnknownRequest(KeyError, ValueError):
    """A `Decoding` call named a request key it cannot answer for (unknown, taken, or not yet
    finished). A `ValueError` like every bad argument, and a `KeyError` as before."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
