"""Prompt encoding and the left-padded canvas `[padding][prompt][MASK x G]`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def encode_prompts(prompts: Sequence[str] | Sequence[Sequence[int]], tokenizer: Any,
                   vocab_size: int | None = None, mask_id: int | None = None) -> list[list[int]]:
    """B prompts (strings or token-id lists) -> B non-empty token-id lists.

    Raises:
        TypeError: prompts that are not a list of strings or of integer sequences.
        ValueError: no prompts, an empty prompt, strings without a tokenizer, a token id outside
            `[0, vocab_size)`, or the [MASK] id inside a prompt.
    """
    if isinstance(prompts, Tensor):
        if prompts.dim() != 2 or prompts.dtype.is_floating_point:
            raise TypeError(f"a prompt tensor must be (B, P) integer ids, got {prompts.dtype} "
                            f"{tuple(prompts.shape)}")
        prompts = prompts.tolist()
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of strings or token-id lists, got "
                        f"{type(prompts).__name__} (wrap a single prompt in a list)")
    if not len(prompts):
        raise ValueError("prompts must be a non-empty list of strings or token-id lists")
    ids: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ValueError(f"prompt {i} is not valid text: {prompt[err.start]!r} at character "
                                 f"{err.start} is a lone surrogate (no Unicode character)") from None
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer (the model ships none): pass token ids")
            row = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt.strip() else []
        elif isinstance(prompt, (Sequence, Tensor)) and not isinstance(prompt, bytes):
            row = [_token_id(i, t) for t in (prompt.tolist() if isinstance(prompt, Tensor) else prompt)]
        else:
            raise TypeError(f"prompt {i} must be a string or a list of token ids, got "
                            f"{type(prompt).__name__}")
        if not row:
            raise ValueError(f"prompt {i} is empty")
        if vocab_size is not None and not all(0 <= t < vocab_size for t in row):
            bad = next(t for t in row if not 0 <= t < vocab_size)
            raise ValueError(f"prompt {i} holds token id {bad}, outside the vocabulary [0, {vocab_size})")
        if mask_id is not None and mask_id in row:
            raise ValueError(f"prompt {i} holds the [MASK] id {mask_id}; prompts must be clean text "
                             f"(the loop decodes only the generation region)")
        ids.append(row)
    return ids


def _token_id(prompt: int, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):      # ints and numpy ints
        raise TypeError(f"prompt {prompt} holds {value!r}; token ids must be integers")
    return int(value)


def left_pad(ids: list[list[int]], gen_length: int, mask_id: int, pad_id: int,
             device: torch.device) -> tuple[Tensor, Tensor | None]:
    """(B, P + G) canvas with prompts right-aligned at column P, and its attention mask.

    The mask is None when no row is padded, so the model takes its unmasked fast path.
    """
    width = max(len(row) for row in ids)
    canvas = torch.full((len(ids), width + gen_length), mask_id, dtype=torch.long)
    mask = torch.ones_like(canvas)
    for b, row in enumerate(ids):                     # host-side setup, once per call
        canvas[b, :width - len(row)] = pad_id
        canvas[b, width - len(row):width] = torch.tensor(row)
        mask[b, :width - len(row)] = 0
    padded = any(len(row) < width for row in ids)
    return canvas.to(device), (mask.to(device) if padded else None)


def chat_prompt(tokenizer: Any, prompt: str, enabled: bool = True) -> str:
    """`prompt` as one user turn in the tokenizer's chat template, ready for the answer (the
    form instruction-tuned checkpoints were trained on); unchanged when `enabled` is off or the
    tokenizer has no template. Every command, eval, spec and the lm-eval adapter wrap prompts
    here."""
    if not enabled or tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                         add_generation_prompt=True, tokenize=False)
