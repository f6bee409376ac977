"""Errors the library raises beyond `ValueError`/`TypeError` (no heavy imports: the CLI maps them)."""

from __future__ import annotations


class NonFiniteLogits(RuntimeError):
    """The model produced NaN or infinite logits: its weights, dtype or inputs are broken (no
    unmasking rule can decode that)."""

    @classmethod
    def of(cls, model: object, rows: list[int]) -> NonFiniteLogits:
        name = getattr(model, "name_or_path", None) or type(model).__name__
        return cls(f"model {name} produced NaN or infinite logits (rows {rows} of the batch): "
                   f"check its weights and dtype (float16 overflows), not the scheduler")


class UnknownRequest(KeyError, ValueError):
    """A `Decoding` call named a request key it cannot answer for (unknown, taken, or not yet
    finished). A `ValueError` like every bad argument, and a `KeyError` as before."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
