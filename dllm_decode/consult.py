"""The extra forwards a rule may ask for in a step, run on its rows and counted.

A scheduler with `lookahead_candidates > 0` proposes candidate actions (`Scheduler.lookahead`);
the loop writes each into a copy of the row's canvas, runs ONE forward of the dLLM over all the
candidate canvases (no cache: the whole canvas), and hands the rule each candidate canvas's
per-column entropy (`StepInput.lookahead_entropy`). A scheduler that names a `guide` gets the
causal guide's log-probabilities over its window (`StepInput.guide_logits`, `dllm_decode.guide`).

Accounting: a look-ahead is a separate forward call, so it adds one to the NFE of every row that
proposed a candidate, and the number of candidate canvases to its forward rows; a guide forward
adds one to the guide NFE of every row with work. `Consultant` keeps these per-row counts for
the caller to add to its counters. One host read per look-ahead step (the most candidates any row
proposed): the call runs that many canvases per row, and none when no row proposed. A row with
fewer candidates than the busiest one is padded with its empty ones, which are not counted as
its forward rows. The read is within the loop's budget of one sync per forward.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
from torch import Tensor

from dllm_decode.interfaces import StepInput


class LookAhead(NamedTuple):
    """Per candidate canvas (b, N, L - offset): entropy in nats (+inf where not masked or the
    candidate is empty), the argmax token ([MASK] excluded) and its probability."""

    entropy: Tensor
    top: Tensor
    top_prob: Tensor


def lookahead_entropy(model: Any, canvas: Tensor, attention_mask: Tensor | None, offset: int,
                      actions: Tensor, tokens: Tensor, mask_id: int) -> Tensor:
    """(b, N, L - offset) entropy in nats of the dLLM's prediction at every column from `offset`
    on, in each of the N candidate canvases: the row's (b, L) canvas with candidate n's (b, N, W)
    `actions` columns (window columns from `offset`) set to its `tokens`. +inf at columns not
    masked in that canvas, and everywhere for an empty candidate. One forward over b * N rows."""
    return lookahead(model, canvas, attention_mask, offset, actions, tokens, mask_id).entropy


def lookahead(model: Any, canvas: Tensor, attention_mask: Tensor | None, offset: int,
              actions: Tensor, tokens: Tensor, mask_id: int) -> LookAhead:
    """`lookahead_entropy`'s forward, with each canvas's argmax and its probability too."""
    batch, n, width = actions.shape
    length = canvas.shape[1]
    rows = canvas.repeat_interleave(n, 0)
    window = rows[:, offset:offset + width]
    rows[:, offset:offset + width] = torch.where(actions.reshape(batch * n, width),
                                                 tokens.reshape(batch * n, width), window)
    mask = None if attention_mask is None else attention_mask.repeat_interleave(n, 0)
    logits = model(rows, mask, rows=(offset, length)).float()
    logits = logits.index_fill(-1, torch.tensor([mask_id], device=logits.device),
                               torch.finfo(torch.float32).min)
    logp = logits.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    still = rows[:, offset:] == mask_id
    entropy = entropy.masked_fill(~still, float("inf")).reshape(batch, n, length - offset)
    best = logp.max(-1)
    shape = (batch, n, length - offset)
    return LookAhead(entropy.masked_fill(~actions.any(-1, keepdim=True), float("inf")),
                     best.indices.reshape(shape), best.values.exp().reshape(shape))


class Consultant:
    """`decide`'s `consult` hook for one request's rows in one step.

    `memory` is a dict the caller keeps for the request across its steps (the guide's cache of
    the committed prefix lives there; `dllm_decode.guide`).

    Attributes (per row, (b,) long, what this step's extra forwards cost):
        nfe: look-ahead forward calls.
        forward_rows: candidate canvases run.
        guide_nfe: guide forwards.
    """

    def __init__(self, model: Any, canvas: Tensor, attention_mask: Tensor | None,
                 memory: dict[str, Any] | None = None):
        self.model, self.canvas, self.attention_mask = model, canvas, attention_mask
        self.memory = memory                    # the request's, kept across steps (guide cache)
        zeros = torch.zeros(canvas.shape[0], dtype=torch.long, device=canvas.device)
        self.nfe, self.forward_rows, self.guide_nfe = zeros, zeros.clone(), zeros.clone()

    def __call__(self, scheduler: Any, inp: StepInput, state: Any) -> tuple[StepInput, Any]:
        if scheduler.lookahead_candidates > 0:
            actions, tokens, state = scheduler.lookahead(inp, state)
            proposed = actions.any(-1)                                          # (b, N)
            most = int(proposed.sum(-1).max())      # the one host read: candidates to run
            if most == 0:                           # no row proposed: no call
                return inp, state
            # each row's proposed candidates first; run only as many as the busiest row has
            order = proposed.int().argsort(dim=-1, descending=True, stable=True)[:, :most]
            pick = order.unsqueeze(-1).expand(-1, -1, actions.shape[-1])
            ran = lookahead(self.model, self.canvas, self.attention_mask, inp.offset,
                            actions.gather(1, pick), tokens.gather(1, pick), inp.mask_id)
            shape, back = (*actions.shape[:2], ran.entropy.shape[-1]), order.unsqueeze(-1).expand_as(ran.top)
            spread = lambda t, fill: torch.full(shape, fill, dtype=t.dtype, device=t.device).scatter(1, back, t)  # noqa: E731
            self.nfe = self.nfe + proposed.any(-1).long()
            self.forward_rows = self.forward_rows + proposed.sum(-1)
            inp = dataclasses.replace(inp, lookahead_entropy=spread(ran.entropy, float("inf")),
                                      lookahead_top=spread(ran.top, inp.mask_id),
                                      lookahead_top_prob=spread(ran.top_prob, 0.0))
        if scheduler.guide is not None:
            from dllm_decode.guide import load_guide

            guide = load_guide(scheduler.guide, self.model)
            draft = torch.where(inp.is_masked, inp.candidates, inp.current)
            inp = dataclasses.replace(inp, guide_logits=guide.logits(
                self.canvas, self.attention_mask, inp.offset, draft, self.memory))
            self.guide_nfe = self.guide_nfe + inp.live.long()
        return inp, state
