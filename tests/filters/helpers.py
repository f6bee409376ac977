"""Hand-made filter inputs: a Learn2PD network with a closed-form accept rule and step views."""

from __future__ import annotations

import torch

from dllm_decode.interfaces import StepInput
from dllm_decode.filters.mlp import ConfidenceMLP
from dllm_decode.step import step_input

ACCEPT_ABOVE = 0.75
"""`step_mlp` accepts (at threshold 0.96) exactly the slots whose confidence exceeds this."""


def step_mlp(width: int) -> ConfidenceMLP:
    """logit_i = 40 * (c_i - ACCEPT_ABOVE) + logit(0.96): sigmoid > 0.96 iff c_i > ACCEPT_ABOVE."""
    module = ConfidenceMLP(width, width)
    with torch.no_grad():
        module.fc1.weight.copy_(torch.eye(width))
        module.fc1.bias.zero_()
        module.fc2.weight.copy_(40 * torch.eye(width))
        module.fc2.bias.fill_(-40 * ACCEPT_ABOVE + torch.logit(torch.tensor(0.96)).item())
    return module


EOS = 9
VOCAB = 12


def make_input(confidence: list[list[float]], candidates: list[list[int]], block: list[list[int]],
               offset: int = 0, gen_end: int | None = None) -> StepInput:
    """A hand-made step view: -inf confidence marks a committed (not masked) column; `probs`
    put each column's confidence on its candidate."""
    conf = torch.tensor(confidence, dtype=torch.float32)
    cand = torch.tensor(candidates)
    block_t = torch.tensor(block)
    batch, width = conf.shape
    is_masked = torch.isfinite(conf)
    p = torch.where(is_masked, conf, torch.tensor(0.5))
    probs = ((1 - p) / (VOCAB - 1)).unsqueeze(-1).repeat(1, 1, VOCAB)
    probs.scatter_(-1, cand.unsqueeze(-1), p.unsqueeze(-1))
    end = gen_end if gen_end is not None else offset + width
    return step_input(logits=probs.log(), probs=probs, candidates=cand, confidence=conf,
                      is_masked=is_masked, block=block_t, gen_span=torch.tensor([[0, end]] * batch),
                      offset=offset, eos_ids=(EOS,))
