"""AdaBlock-dLLM: semantic-aware adaptive block size (Lu et al., 2025, arXiv 2509.26432, §4;
code lgxi24/AdaBlock-dLLM@491b205 `llada/generate_adablock.py` `compute_block_length`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.fields import check_probability
from dllm_decode.interfaces import Scheduler, StepInput
from dllm_decode.ops import argmax_mask, masked_scores
from dllm_decode.schedulers.threshold import ThresholdScheduler
from dllm_decode.schedulers.wrapper import Wrapper


@dataclass(frozen=True)
class AdaptiveBlockScheduler(Wrapper):
    """At each block start, end the block on the most confident predicted delimiter.

    At step 0 of a block starting at s (g tokens generated, generation length G):
    window = [s, s + min(floor(window * G), G - g)); D = masked window positions whose candidate
    is a delimiter; i* = the most confident of D (ties: leftmost). The block is [s, i* + 1) if
    c_{i*} >= delimiter_threshold, else the default block (the config's `block_length`, or the
    bound a nested block-bounds base chose). Inside the block, `base` (any scheduler, default
    the threshold rule at 0.9) selects tokens. `delimiter_threshold = inf` recovers fixed blocks.

    Delimiters are token ids, never hard-coded: fill `delimiter_ids` from the tokenizer with
    `delimiter_ids(tokenizer)` (the CLI does so when the field is empty). With no delimiter ids
    every block is the default one.

    The decision reuses the block's first decode step (no extra forward). It needs logits past
    the block, so the view is the rest of the canvas; the prefix and dual caches' refresh
    forward at each block start covers the rest too (a cache whose first step saw less would
    restrict the window to what it returned).

    Defaults: delimiter_threshold 0.3 (LLaDA; use 0.5 for Dream), window 0.25, fallback block
    32 via the config (README table, `llada/eval_adablock.sh`).
    """

    base: Scheduler = field(default_factory=ThresholdScheduler)
    delimiter_threshold: float = 0.3
    infinite_ok = ("delimiter_threshold",)          # documented: inf is a valid setting
    window: float = 0.25
    delimiter_ids: tuple[int, ...] = ()

    view: ClassVar[str] = "rest"
    chooses_block_bounds: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_probability(self, "delimiter_threshold", infinite_ok=True)   # inf: fixed blocks
        if not 0.0 < self.window <= 1.0:
            raise ValueError(f"window must be in (0, 1], got {self.window}")
        if any(not isinstance(i, int) or i < 0 for i in self.delimiter_ids):
            raise ValueError(f"delimiter_ids must be token ids >= 0, got {self.delimiter_ids}")

    def check_fits(self, vocab_size: int, gen_length: int) -> None:
        super().check_fits(vocab_size, gen_length)
        if bad := [i for i in self.delimiter_ids if i >= vocab_size]:
            raise ValueError(f"adaptive_block: delimiter_ids {bad} are outside the model's "
                             f"vocabulary [0, {vocab_size})")

    def block_end(self, inp: StepInput, state: dict[str, Any]) -> tuple[Tensor | None, dict[str, Any]]:
        fallback, state = super().block_end(inp, state)
        fallback = inp.block[:, 1] if fallback is None else fallback
        start = inp.block[:, 0]
        gen_start, gen_end = inp.gen_span[:, 0], inp.gen_span[:, 1]
        size = ((gen_end - gen_start) * self.window).floor().long().clamp_min(1)
        stop = torch.minimum(start + size, gen_end)
        cols = inp.columns
        in_window = (cols >= start.unsqueeze(-1)) & (cols < stop.unsqueeze(-1)) & inp.is_masked
        ids = torch.tensor(self.delimiter_ids, dtype=torch.long, device=cols.device)
        is_delimiter = torch.isin(inp.candidates, ids) & in_window
        conf = inp.probs.gather(-1, inp.candidates.unsqueeze(-1)).squeeze(-1)
        score = masked_scores(conf, is_delimiter)
        best = argmax_mask(score)
        best_col = torch.where(best, cols, 0).sum(-1)
        best_conf = score.max(-1).values
        return torch.where(best_conf >= self.delimiter_threshold, best_col + 1, fallback), state


def delimiter_ids(tokenizer: Any, chars: Sequence[str] = ("\n",)) -> tuple[int, ...]:
    """Token ids that decode to exactly one of `chars` (AdaBlock's delimiters).

    Newline alone is AdaBlock's LLaDA setting; pass `("\\n", ".", ",")` for the multi-delimiter
    variant. A character that does not encode to a single token is looked up in the vocabulary;
    a tokenizer without it (e.g. a word-level one that splits on whitespace) contributes nothing.
    """
    found: set[int] = set()
    for char in chars:
        ids = tokenizer.encode(char, add_special_tokens=False)
        if len(ids) == 1 and tokenizer.decode(ids) == char:
            found.add(int(ids[0]))
            continue
        found |= {int(i) for token, i in tokenizer.get_vocab().items()
                  if tokenizer.convert_tokens_to_string([token]) == char}
    return tuple(sorted(found))


def with_delimiters(scheduler: Scheduler, tokenizer: Any, chars: Sequence[str] = ("\n",)) -> Scheduler:
    """`scheduler` with every empty `delimiter_ids` field (nested components included) filled from
    the tokenizer; unchanged when there is no tokenizer or nothing to fill."""
    if tokenizer is None or not dataclasses.is_dataclass(scheduler):
        return scheduler
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(scheduler):
        value = getattr(scheduler, f.name)
        if isinstance(value, Scheduler):
            filled = with_delimiters(value, tokenizer, chars)
            if filled is not value:
                changes[f.name] = filled
        elif f.name == "delimiter_ids" and value == ():
            changes[f.name] = delimiter_ids(tokenizer, chars)
    return dataclasses.replace(scheduler, **changes) if changes else scheduler
