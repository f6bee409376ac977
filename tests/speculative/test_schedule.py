"""Draft length from the diffusion scheduler interface, and the AR-only heuristic scheduler."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_decode.speculative import (DRAFT_LENGTHS, Draft, HeuristicScheduler, check_scheduler,
                                     draft_length)
from dllm_decode.speculative.schedule import EarlyStop
from dllm_decode.schedulers import SCHEDULERS, LowConfidenceScheduler, ThresholdScheduler

V = 11


def draft_of(confidence: list[float], seed: int = 0) -> Draft:
    generator = torch.Generator().manual_seed(seed)
    view = torch.rand(len(confidence), V, generator=generator).softmax(-1)
    tokens = view.argmax(-1)
    return Draft(tokens, torch.tensor(confidence), view=view)


def length(scheduler, confidence, width=None) -> int:
    state = scheduler.init_state(1, torch.device("cpu"))
    return draft_length(scheduler, draft_of(confidence), state, V, width)[0]


def test_threshold_stops_at_the_first_unsure_token():
    """HF assistant_confidence_threshold: drafting stops at the first token below tau."""
    tau = ThresholdScheduler(0.5)
    assert length(tau, [0.9, 0.8, 0.4, 0.95, 0.99]) == 2
    assert length(tau, [0.9, 0.8, 0.7, 0.6]) == 4
    assert length(tau, [0.5, 0.5]) == 2                       # ties pass (>=)
    assert length(tau, [0.1, 0.9]) == 1                       # always at least one


@pytest.mark.parametrize("steps,expected", [(1, 6), (2, 3), (4, 2), (None, 1)])
def test_low_confidence_gives_a_constant_length(steps, expected):
    """ceil(k / steps) tokens whatever the confidences: the running minimum makes it a prefix."""
    scheduler = LowConfidenceScheduler(steps_per_block=steps)
    for confidence in ([0.9, 0.2, 0.8, 0.7, 0.95, 0.3], [0.1, 0.99, 0.99, 0.99, 0.99, 0.99]):
        assert length(scheduler, confidence) == expected == math.ceil(6 / (steps or 6))


def test_short_draft_sees_the_full_window():
    """A draft that ended early is judged as the full window (missing positions certain)."""
    scheduler = LowConfidenceScheduler(steps_per_block=2)
    assert length(scheduler, [0.9] * 5, width=8) == 4
    assert length(scheduler, [0.9] * 3, width=8) == 3         # capped at what was drafted


def test_early_stop():
    """Stop once the scheduler would cut before the newest token, asking it only on a new low."""
    tau = ThresholdScheduler(0.5)
    stop = EarlyStop(tau, 6, V)
    assert not stop(draft_of([0.9])) and not stop(draft_of([0.9, 0.6]))
    assert stop(draft_of([0.9, 0.6, 0.4]))
    constant = EarlyStop(LowConfidenceScheduler(steps_per_block=3), 6, V)   # 2 of 6 positions
    assert not constant(draft_of([0.9])) and not constant(draft_of([0.9, 0.95]))
    assert constant(draft_of([0.9, 0.95, 0.97]))          # no new low, the last answer stands
    asked = []

    class Counting(ThresholdScheduler):
        def select(self, inp, state):
            asked.append(1)
            return super().select(inp, state)

    counting = EarlyStop(Counting(0.5), 6, V)
    for n in range(1, 5):
        counting(draft_of([0.9, 0.95, 0.8, 0.99][:n]))
    assert len(asked) == 2                                # at 0.9 and at the new low 0.8


def test_heuristic_schedule():
    """+2 after a full acceptance, -1 otherwise, within [minimum, maximum]; reset per request."""
    h = HeuristicScheduler(initial=5, maximum=8)
    state = h.init_state(1, torch.device("cpu"))
    assert h.propose_length(state) == 5
    state = h.feedback(state, drafted=5, accepted=5)
    assert state == 7
    state = h.feedback(state, drafted=7, accepted=7)
    assert state == 8                                         # capped
    state = h.feedback(state, drafted=8, accepted=3)
    assert state == 7
    for _ in range(10):
        state = h.feedback(state, drafted=2, accepted=0)
    assert state == 1 and h.init_state(1, torch.device("cpu")) == 5
    assert length(h, [0.1, 0.1, 0.1]) == 3                    # the width already is its choice


@pytest.mark.parametrize("kwargs", [dict(minimum=0), dict(initial=0), dict(maximum=2, initial=5),
                                    dict(increase=-1)])
def test_heuristic_validation(kwargs):
    with pytest.raises(ValueError, match="must be"):
        HeuristicScheduler(**kwargs)


@pytest.mark.parametrize("name", sorted({**SCHEDULERS, **DRAFT_LENGTHS}))
def test_every_registered_scheduler_maps_or_is_rejected(name):
    """Each registered scheduler either gives a draft length in [1, g] or a clear error."""
    scheduler = {**SCHEDULERS, **DRAFT_LENGTHS}[name]()
    if getattr(scheduler, "chooses_block_bounds", False):
        with pytest.raises(ValueError, match="block"):
            check_scheduler(scheduler)
        return
    check_scheduler(scheduler)
    for seed in range(3):
        confidence = torch.rand(7, generator=torch.Generator().manual_seed(seed)).tolist()
        draft = draft_of(confidence, seed)
        state = scheduler.init_state(1, torch.device("cpu"))
        g, _ = draft_length(scheduler, draft, state, V, 7, torch.Generator().manual_seed(seed))
        assert 1 <= g <= 7
