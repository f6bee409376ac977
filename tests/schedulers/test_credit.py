"""CreditDecoding: credit decays by beta, the top-1 gains p^gamma, logits gain alpha log(1 + C)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, generate
from dllm_decode.testing import OracleMaskPredictor
from dllm_decode.schedulers import CreditScheduler, LocalLeapScheduler, ThresholdScheduler
from tests.schedulers.inputs import step_input

ALPHA, BETA, GAMMA = 0.7, 0.8, 0.2


def fuse(scheduler, inp, state):
    fused, state = scheduler.process_logits(inp, state)
    return fused, state


def probs_of(logits: list[float]) -> torch.Tensor:
    return torch.tensor(logits).softmax(-1)


def test_first_step_boosts_only_the_top1_token():
    logits = torch.tensor([[[2.0, 1.0, 0.0]]])
    credit = CreditScheduler()
    fused, _ = fuse(credit, step_input(logits), credit.init_state(1, torch.device("cpu")))
    p = probs_of([2.0, 1.0, 0.0])
    expected = logits.clone()
    expected[0, 0, 0] += ALPHA * torch.log1p(p[0] ** GAMMA)
    assert torch.allclose(fused, expected)


def test_credit_decays_and_accumulates_per_token_over_steps():
    credit = CreditScheduler()
    state = credit.init_state(1, torch.device("cpu"))
    steps = [[2.0, 1.0, 0.0], [0.0, 3.0, 0.0], [1.5, 0.0, 0.0]]      # top-1: token 0, 1, 0
    for step, row in enumerate(steps):
        fused, state = fuse(credit, step_input(torch.tensor([[row]]), step=step), state)
    p = [probs_of(row) for row in steps]
    c0 = BETA ** 2 * p[0][0] ** GAMMA + p[2][0] ** GAMMA
    c1 = BETA * p[1][1] ** GAMMA
    expected = torch.tensor(steps[2]) + ALPHA * torch.log1p(torch.tensor([c0, c1, 0.0]))
    assert torch.allclose(fused[0, 0], expected)
    assert state["credit"].shape[-1] <= len(steps) < 3 * 3          # slots per step, not per vocab


def test_credit_can_change_the_committed_token():
    credit = CreditScheduler()
    state = credit.init_state(1, torch.device("cpu"))
    for step in range(3):                                           # token 0 leads three steps
        _, state = fuse(credit, step_input(torch.tensor([[[3.0, 0.0, 0.0]]]), step=step), state)
    close_call = torch.tensor([[[1.0, 1.2, 0.0]]])                  # token 1 now slightly ahead
    fused, _ = fuse(credit, step_input(close_call, step=3), state)
    assert close_call.argmax(-1).item() == 1 and fused.argmax(-1).item() == 0


def test_credit_restarts_at_each_block_and_skips_unmasked_positions():
    credit = CreditScheduler()
    state = credit.init_state(1, torch.device("cpu"))
    logits = torch.tensor([[[2.0, 0.0], [2.0, 0.0]]])
    _, state = fuse(credit, step_input(logits, masked=torch.tensor([[True, False]])), state)
    fresh, _ = fuse(credit, step_input(logits, step=0), state)       # a new block: step 0 again
    first, _ = fuse(credit, step_input(logits, step=0), credit.init_state(1, torch.device("cpu")))
    assert torch.equal(fresh, first)
    skipped, _ = fuse(credit, step_input(logits, masked=torch.tensor([[True, False]])),
                      credit.init_state(1, torch.device("cpu")))
    assert torch.equal(skipped[0, 1], logits[0, 1])


def test_credit_is_keyed_by_canvas_column_when_the_window_moves():
    credit = CreditScheduler()
    state = credit.init_state(1, torch.device("cpu"))
    wide = torch.tensor([[[0.0, 2.0], [2.0, 0.0], [0.0, 0.0]]])      # columns 10, 11, 12
    _, state = fuse(credit, step_input(wide, offset=10), state)
    narrow = torch.tensor([[[2.0, 0.0], [0.0, 0.0]]])                # columns 11, 12 at step 1
    fused, _ = fuse(credit, step_input(narrow, offset=11, step=1), state)
    carried = BETA * probs_of([2.0, 0.0])[0] ** GAMMA + probs_of([2.0, 0.0])[0] ** GAMMA
    assert torch.allclose(fused[0, 0, 0], torch.tensor(2.0) + ALPHA * torch.log1p(carried))


def test_credit_feeds_any_selection_rule():
    leap = LocalLeapScheduler(kappa=0.8)
    credit = CreditScheduler(base=leap)
    inp = step_input(torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(0)))
    state = credit.init_state(2, torch.device("cpu"))
    decision, _ = credit.select(inp, state)
    assert torch.equal(decision.commit, leap.select(inp, None)[0].commit)
    assert credit.view == leap.view and not credit.chooses_block_bounds


@pytest.mark.parametrize("bad, message", [
    (dict(alpha=-0.1), "alpha"), (dict(beta=1.5), r"beta must be in \[0, 1\], got 1.5"),
    (dict(gamma=float("nan")), "gamma"), (dict(base="threshold"), "base must be a Scheduler"),
])
def test_invalid_fields_are_rejected(bad, message):
    with pytest.raises(ValueError, match=message):
        CreditScheduler(**bad)


def test_credit_commits_a_hesitant_block_in_fewer_steps_than_its_threshold():
    # every position: p = 0.7 on its target, below tau = 0.8. Step 0: fused p = 0.787 (< 0.8),
    # one forced commit; step 1: credit 0.8 * 0.7^0.2 + 0.7^0.2 lifts p to 0.823, the rest commit.
    vocab = 37
    model = OracleMaskPredictor(torch.tensor([3, 4, 5, 6]), torch.full((4,), 0.7), vocab, vocab - 1, vocab - 2)
    config = DecodeConfig(scheduler=CreditScheduler(), gen_length=4, block_length=4, stop_at_eos=False)
    fused = generate(model, [[1, 2]], config)
    plain = generate(model, [[1, 2]], dataclasses.replace(config, scheduler=ThresholdScheduler(0.8)))
    assert fused.tokens[0].tolist() == plain.tokens[0].tolist() == [3, 4, 5, 6]
    assert fused.nfe.tolist() == [2] and plain.nfe.tolist() == [4]
