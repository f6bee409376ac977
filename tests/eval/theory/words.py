"""Token ids of task text for the tests that build canvases by hand."""

from __future__ import annotations

from dllm_decode.eval.tasks.tokenizer import vocabulary

VOCAB = vocabulary()


def encode(text: str) -> list[int]:
    """Ids of space-separated task text (the word-level tokenizer's result, without its overhead)."""
    return [VOCAB[word] for word in text.split()]
