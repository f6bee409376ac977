"""Prompt encoding and the left-padded canvas `[padding][prompt][MASK x G]`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def encode_prompts(prompts: Sequence[str] | Sequence[Sequence[int]], tokenizer: Any) -> list[list[int]]:
    """B prompts (strings or token-id lists) -> B non-empty token-id lists.

    Raises:
        ValueError: no prompts, an empty prompt, or strings without a tokenizer.
    """
    if isinstance(prompts, (str, Tensor)) or not len(prompts):
        if isinstance(prompts, Tensor):
            return encode_prompts(prompts.tolist(), tokenizer)
        raise ValueError("prompts must be a non-empty list of strings or token-id lists")
    ids: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer (the model ships none): pass token ids")
            row = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt.strip() else []
        else:
            row = [int(t) for t in prompt]
        if not row:
            raise ValueError(f"prompt {i} is empty")
        ids.append(row)
    return ids


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
