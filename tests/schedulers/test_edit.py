"""`edit`: LLaDA2.1's joint M2T + T2T threshold rule, by hand and through the loop."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.schedulers import EditScheduler
from tests.schedulers.inputs import step_input

VOCAB, MASK, EOS = 8, 7, 6


def view(p_top: list[float], top: list[int], current: list[int], masked: list[bool]):
    """One row: column i's argmax is `top[i]` with probability `p_top[i]`; committed columns hold
    `current[i]` and are revisable."""
    width = len(p_top)
    probs = torch.zeros(1, width, VOCAB)
    for i, (p, t) in enumerate(zip(p_top, top)):
        probs[0, i] = (1 - p) / (VOCAB - 2)
        probs[0, i, MASK] = 0.0
        probs[0, i, t] = p
    inp = step_input(probs=probs, masked=torch.tensor([masked]))
    current = torch.tensor([[MASK if m else c for c, m in zip(current, masked)]])
    return dataclasses.replace(inp, current=current, revisable=~torch.tensor([masked]))


def test_both_bars_are_strict():
    rule = EditScheduler(threshold=0.8, edit_threshold=0.5)
    inp = view(p_top=[0.8, 0.81, 0.5, 0.51, 0.99], top=[1, 1, 2, 2, 3],
               current=[0, 0, 1, 1, 3], masked=[True, True, False, False, False])
    decision, _ = rule.select(inp, None)
    assert decision.commit[0].tolist() == [False, True, False, False, False]   # 0.8 is not > 0.8
    # 0.5 is not > 0.5; 0.51 edits; a column whose argmax is its own token is left alone
    assert decision.edit[0].tolist() == [False, False, False, True, False]


def test_paper_defaults_and_validation():
    assert (EditScheduler().threshold, EditScheduler().edit_threshold, EditScheduler().post_steps) == (0.95, 0.9, 16)
    assert EditScheduler.revises == "block"
    for bad in (dict(threshold=1.0), dict(edit_threshold=-0.1), dict(post_steps=-1)):
        with pytest.raises(ValueError):
            EditScheduler(**bad)


class ChangesItsMind(torch.nn.Module):
    """Predicts token 1 at every generated column while any mask is left in the row and token 2
    (p 0.99) once the row is full: a rule that edits must end with 2s, one that cannot with 1s."""

    supports_kv = False

    def __init__(self):
        super().__init__()
        self.mask_token_id, self.eos_token_ids, self.vocab_size, self.max_length = MASK, (EOS,), VOCAB, None

    def forward(self, input_ids, attention_mask=None, positions=None, kv=None, rows=None):
        full = ~(input_ids == MASK).any(-1, keepdim=True)
        logits = torch.full((*input_ids.shape, VOCAB), -10.0)
        logits[..., 1] = torch.where(full, 0.0, 10.0)
        logits[..., 2] = torch.where(full, 10.0, 0.0)
        a, b = rows if rows is not None else (0, input_ids.shape[1])
        return logits[:, a:b]


def test_the_loop_runs_edit_passes_after_the_fill_and_stops_when_nothing_changes():
    config = DecodeConfig(scheduler=EditScheduler(threshold=0.5), gen_length=4, block_length=4,
                          stop_at_eos=False)
    result = generate(ChangesItsMind(), [[3, 4]], config, trace=True)
    assert result.tokens[0].tolist() == [2, 2, 2, 2]
    # one fill step (all four 1s), one pass editing all four to 2, one pass that edits nothing
    assert result.nfe.tolist() == [3] and [int(s["edit"].sum()) for s in result.trace] == [0, 4, 0]
    frozen = DecodeConfig(scheduler=EditScheduler(threshold=0.5, post_steps=0), gen_length=4,
                          block_length=4, stop_at_eos=False)
    assert generate(ChangesItsMind(), [[3, 4]], frozen).tokens[0].tolist() == [1, 1, 1, 1]
