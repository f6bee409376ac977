"""A masked diffusion LM drafts a whole block in parallel; the AR target verifies it.

SpecDiff (Christopher et al., arXiv 2408.05636), DiffuSpec (arXiv 2510.02358), FailFast
(arXiv 2512.20573) in their simplest form: the dLLM decodes `width` masked positions after the AR
context with the toolkit's own `generate` and an unmasking scheduler, and the AR model checks the
block left to right. Greedy (argmax) unmasking is deterministic, so q is one-hot and the result
is lossless with respect to the AR target whatever the dLLM proposes: verification only ever
keeps tokens the target itself would emit (greedy) or corrects them to the target's law.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import Cache, DiffusionLM, NoCache, Scheduler
from dllm_decode.sampler import generate
from dllm_decode.speculative.drafters.base import Draft, Drafter, cut_at_eos
from dllm_decode.speculative.drafters.spec import Built, DraftContext, DraftSpec, same_vocabulary
from dllm_decode.speculative.sampling import Sampling


@dataclass(frozen=True, eq=False)
class DiffusionDrafter(Drafter):
    """Draft `width` tokens as one block of the dLLM (`dllm_decode.generate`, temperature 0).

    The dLLM must share the target's token ids. Its per-token confidence (the clean softmax
    probability when the token was committed, read from the step trace) is what the
    draft-length scheduler sees; q stays one-hot because argmax unmasking is deterministic.

    Attributes:
        model: the DiffusionLM.
        scheduler: its unmasking policy (which positions to commit each denoising step).
        cache: its logits cache (default: a full forward per step).
        drop_ids: token ids removed from the AR context before it becomes the dLLM prompt (e.g.
            the `=` separator of the embedded AR format, which the dLLM never saw).
    """

    model: DiffusionLM
    scheduler: Scheduler
    cache: Cache = field(default_factory=NoCache)
    drop_ids: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        kind = getattr(self.model, "canvas_kind", "mask")
        if kind != "mask":          # its confidence is read from the masked loop's step trace
            raise ValueError(f"the dLLM drafter needs a masked diffusion model; this one's canvas is "
                             f"{kind!r} (a uniform-noise model cannot draft)")

    def propose(self, context: Tensor, width: int, sampling: Sampling,
                generator: torch.Generator | None, eos_ids: tuple[int, ...], state: Any,
                stop: Callable[[Draft], bool] | None = None) -> tuple[Draft, Any]:
        prompt = context
        if self.drop_ids:
            prompt = context[~torch.isin(context, torch.tensor(self.drop_ids, device=context.device))]
        limit = getattr(self.model, "max_length", None)
        if limit is not None:
            width = min(width, limit - prompt.shape[0])
        if width < 1 or not prompt.numel():
            return Draft.empty(context.device), state
        config = DecodeConfig(scheduler=self.scheduler, cache=self.cache, gen_length=width,
                              block_length=width, temperature=0.0, stop_at_eos=True)
        result = generate(self.model, [prompt.tolist()], config, generator=generator, tokenizer=None,
                          trace=True)
        tokens = result.tokens[0].to(context.device)
        confidence = _commit_confidence(result.trace, width).to(context.device)
        draft = Draft(tokens, confidence, forwards=int(result.nfe[0]))
        return draft.head(cut_at_eos(tokens, tuple(eos_ids) or tuple(self.model.eos_token_ids))), state


@dataclass(frozen=True)
class DiffusionDraft(DraftSpec):
    """A masked diffusion LM drafts each round's tokens as one block (SpecDiff).

    Its unmasking scheduler and the text dropped from its context come from the `DraftContext`.

    Attributes:
        model: the dLLM, a `load_model` name or directory (`embedded` by default); it must share
            the target's token ids.
    """

    model: str = "embedded"

    def build(self, context: DraftContext) -> Built:
        from dllm_decode.models.loading import load_model

        model = load_model(self.model or "embedded", device=context.device)
        same_vocabulary(context.target, model.vocab_size)
        unmasking = context.unmasking
        if unmasking is None:
            from dllm_decode.registry import component

            unmasking = component("scheduler", "threshold")
        drop_ids = _token_ids(context.target, context.drop_text)
        return Built(DiffusionDrafter(model, unmasking, drop_ids=drop_ids), model)


def _token_ids(target: Any, text: str) -> tuple[int, ...]:
    """The token ids of `text` in the target's tokenizer (none for blank text)."""
    if not text.strip():
        return ()
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("dropping text from a dLLM draft's context needs a target with a tokenizer")
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def _commit_confidence(trace: list[dict[str, Any]] | None, width: int) -> Tensor:
    """(width,) confidence each generated position had at the step that committed it (1 if never
    recorded, e.g. end-of-text filled after an early stop)."""
    confidence = torch.ones(width)
    for step in trace or ():                            # one entry per denoising step, not per token
        commit, conf = step["commit"][0], step["confidence"][0].float()
        columns = torch.arange(commit.shape[0]) + step["offset"]
        keep = commit & (columns >= 0) & (columns < width)
        confidence[columns[keep]] = conf[keep]
    return confidence
