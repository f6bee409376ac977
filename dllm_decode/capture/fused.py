"""The whole step in one graph, for rules that can be captured: the model forward over the
padded window, the candidates, the scheduler's decision, the loop's rules (`Decision.resolve`),
the canvas write, and one small status tensor the host reads once.

It runs the same maths as the eager step (`step.step_input`, the scheduler's `select`,
`Decision.resolve`, `step.write`) with the step counters and the window offset as 0-d device
tensors, so one graph serves every step of every block in its bucket.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dllm_decode.capture.step import Head, captured_forward
from dllm_decode.models.compact import CompactStack
from dllm_decode.step import Resolved, step_input, write

STATUS_ROWS = ("block_left", "gen_left", "block_eos", "worked", "nonfinite")
"""The rows of the status tensor a fused step returns, (5, B) long, read by the host once."""


def fused_step(stack: CompactStack, head: Head, cos_table: Tensor, sin_table: Tensor,
               canvas: Tensor, attention: Tensor, keys: Tensor, values: Tensor, fed: Tensor,
               out: Tensor, prev: Tensor, block: Tensor, gen_span: Tensor, step: Tensor,
               num_steps: Tensor, eos: Tensor, scheduler: Any, mask_id: int) -> Tensor:
    """One greedy denoising step of every row, in place on `canvas`; returns the (5, B) status.

    Args (beyond `captured_forward`'s):
        out: (O,) fed rows of the window: the canvas columns `[block start, block start + O)`
            (padding points at the scratch column's fed row).
        block, gen_span: (B, 2) each row's active block and generation region.
        step, num_steps: 0-d long, the step within the block and the block's budget.
        eos: (E,) end-of-text ids. scheduler: a rule with `capturable = True`.
    """
    logits = captured_forward(stack, head, cos_table, sin_table, canvas, attention, keys,
                              values, fed, out, prev)
    columns = fed.index_select(0, out)                      # canvas column of each window column
    tokens = canvas.index_select(1, columns)
    vocab = torch.arange(logits.shape[-1], device=logits.device)
    logits = logits.masked_fill(vocab == mask_id, torch.finfo(torch.float32).min)
    probs = logits.softmax(-1)
    inp = step_input(logits=logits, probs=probs, candidates=probs.argmax(-1), current=tokens,
                     block=block, gen_span=gen_span,
                     offset=block[0, 0], step=step, num_steps=num_steps, mask_id=mask_id)
    nonfinite = inp.probs.gather(-1, inp.candidates.unsqueeze(-1)).squeeze(-1).isnan().any(-1)
    decision, _ = scheduler.select(inp, None)
    commit, chosen = decision.resolve(inp)
    none = torch.zeros_like(commit)
    canvas.index_copy_(1, columns, write(tokens, Resolved(commit, chosen, none, none), mask_id))
    every = torch.arange(canvas.shape[1], device=canvas.device)
    in_block = (every >= block[:, :1]) & (every < block[:, 1:])
    still = canvas == mask_id
    is_eos = (canvas.unsqueeze(-1) == eos).any(-1)
    return torch.stack([(still & in_block).any(-1), (still & (every >= gen_span[:, :1])).any(-1),
                        (is_eos & in_block).any(-1), inp.live, nonfinite]).long()
