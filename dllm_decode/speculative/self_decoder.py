"""The interface of the self-speculative decoders (`SelfDecoder`), and the AR-mode greedy decode
that the strict modes of S2D2 and SimSD reproduce."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.fields import Checked
from dllm_decode.interfaces import DiffusionLM
from dllm_decode.speculative.blockrun import BlockRun, SpecDecode, check_base, check_mask_canvas, check_verifier
from dllm_decode.step import propose


class SelfDecoder(Checked, abc.ABC):
    """A `SELF_DECODERS` entry: a frozen dataclass of a self-speculative decoder's options (built
    by `registry.build` like a scheduler, every field type-checked) that decodes a batch with the
    model alone.

    Class attributes declare what it supports: `needs_verifier` (True: a token-shifted block
    model's autoregressive mode verifies, `check_verifier`), and `strict_base`, the decode its
    strict mode reproduces token for token (`"generate"`: the base rule's own decode;
    `"ar_mode"`: `ar_mode_generate`).
    """

    needs_verifier: ClassVar[bool] = True
    strict_base: ClassVar[str] = "ar_mode"

    @abc.abstractmethod
    def decode(self, model: DiffusionLM, prompts: Sequence[str | Sequence[int]], config: DecodeConfig,
               generator: torch.Generator | None = None, tokenizer: Any = None) -> SpecDecode:
        """Decode `prompts` (texts with a tokenizer, or token ids) under `config`'s base rule.

        Raises:
            ValueError: a model or config the decoder refuses (`check_verifier`, `check_base`),
                or what every decode entry point refuses (`member.check_request`).
        """

    def check(self, model: DiffusionLM, config: DecodeConfig) -> None:
        """Raise the one-line ValueError `decode` would raise for this model and record before any
        work (`check_mask_canvas`, `check_verifier` when it verifies in AR mode, `check_base`), so every entry point
        (CLI decode and eval, the tuner) refuses the same pairs the same way."""
        from dllm_decode.registry import name_of

        check_mask_canvas(model, name_of(self))
        if self.needs_verifier:
            check_verifier(model, name_of(self))
        check_base(config, name_of(self))

    @property
    @abc.abstractmethod
    def strict(self) -> bool:
        """Whether this configuration is the lossless one (reproduces `strict_base`)."""


@torch.inference_mode()
def ar_mode_generate(model: DiffusionLM, prompts: Sequence[str | Sequence[int]], config: DecodeConfig,
                     tokenizer: Any = None) -> SpecDecode:
    """The model's own block-size-1 greedy decode: each forward runs the active model block in
    autoregressive mode (`BlockRun.ar_logits`) and commits the argmax at each row's first masked
    column, block by block under the loop's end-of-text stop. The strict modes of S2D2 and SimSD
    reproduce it token for token (its scheduler is unused)."""
    check_verifier(model, "AR-mode decoding")
    run = BlockRun.open(model, prompts, config, tokenizer)
    mask = model.mask_token_id
    while not bool(run.done.all()):
        rows = run.live()
        logits = run.ar_logits(rows, run.x[rows])
        x = run.x[rows]
        frontier = (run.masked_in_block(rows)).int().argmax(-1)
        _, _, top = propose(logits, mask)
        token = top.gather(1, (frontier - run.gen_start)[:, None]).squeeze(1)
        x[torch.arange(len(rows), device=x.device), frontier] = token
        run.x[rows] = x
        run.step[rows] += 1
        run.advance()
    return run.result()
