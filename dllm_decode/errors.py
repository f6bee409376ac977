"""Errors the library raises beyond `ValueError`/`TypeError` (no heavy imports: the CLI maps them)."""

from __future__ import annotations


def model_name(model: object) -> str:
    """How a message names a model: its load name (else its class), quoted, so a server can show
    its served model id in place of a folder (`dllm_decode.serve.app.ServerState.public`)."""
    return repr(getattr(model, "name_or_path", None) or type(model).__name__)


class NonFiniteLogits(RuntimeError):
    """The model produced NaN or infinite logits: its weights, dtype or inputs are broken (no
    unmasking rule can decode that)."""

    @classmethod
    def of(cls, model: object, rows: list[int]) -> NonFiniteLogits:
        return cls(f"model {model_name(model)} produced NaN or infinite logits (rows {rows} of the batch): "
                   f"check its weights and dtype (float16 overflows), not the scheduler")


class UnknownRequest(KeyError, ValueError):
    """A `Decoding` call named a request key it cannot answer for (unknown, taken, or not yet
    finished). A `ValueError` like every bad argument, and a `KeyError` as before."""

    @classmethod
    def of(cls, key: object, in_flight: object) -> UnknownRequest:
        """Unknown `key`, or (`in_flight`: what it is doing) known but not in the state the call
        needs."""
        if in_flight:
            return cls(f"request {key!r} {in_flight}")
        return cls(f"no request {key!r} in this batch (results are handed over once)")

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
