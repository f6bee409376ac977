"""A small causal LM drafts autoregressively (Leviathan et al. 2023; HF `AssistedCandidateGenerator`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dllm_decode.speculative.drafters.base import Draft, Drafter
from dllm_decode.speculative.kv import KV, extend, feed, new_kv
from dllm_decode.speculative.sampling import Sampling


@dataclass(frozen=True, eq=False)
class ModelDrafter(Drafter):
    """Draft `width` tokens with a causal LM that shares the target's tokenizer.

    The draft samples with the target's own `Sampling` and reports that warped distribution as
    q (the fix of HF #32867/#47932: a greedy or raw-logit q under a sampling target is not
    lossless). Under greedy decoding the draft is deterministic and q is not needed. Its KV cache
    follows the accepted context by common-prefix rollback, so rejected drafts never leak in.

    Attributes:
        model: a transformers causal LM (or anything with the same forward signature).
    """

    model: nn.Module

    def init_state(self) -> KV:
        return new_kv(self.model)

    def propose(self, context: Tensor, width: int, sampling: Sampling,
                generator: torch.Generator | None, eos_ids: tuple[int, ...], state: Any,
                stop: Callable[[Draft], bool] | None = None) -> tuple[Draft, Any]:
        logits, state = extend(self.model, state, context, 1)
        tokens, dists = [], []
        for i in range(width):                    # autoregressive: one forward per draft token
            if i:
                logits, state = feed(self.model, state, tokens[-1], 1)
            token, dist = sampling.draw(logits, generator)
            tokens.append(token)
            dists.append(dist)
            if int(token) in eos_ids:           # nothing after end-of-text is verified
                break
            if stop is not None and i + 1 < width and stop(self._draft(tokens, dists, sampling)):
                break
        # The last drafted token is never fed: the next round's `extend` feeds what is missing.
        return self._draft(tokens, dists, sampling), state

    @staticmethod
    def _draft(tokens: list[Tensor], dists: list[Tensor], sampling: Sampling) -> Draft:
        drafted, probs = torch.cat(tokens), torch.cat(dists)
        confidence = probs.gather(-1, drafted.unsqueeze(-1)).squeeze(-1)
        return Draft(drafted, confidence, None if sampling.greedy else probs, probs,
                     forwards=len(tokens))
