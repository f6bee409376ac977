"""Stateless selection rules on hand-written confidences: threshold, factor, LocalLeap, EB."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_decode.schedulers import (EntropyBoundScheduler, FactorScheduler, LocalLeapScheduler,
                        ThresholdScheduler)
from tests.schedulers.inputs import step_input, with_confidence


def committed(scheduler, inp) -> list[list[int]]:
    decision, _ = scheduler.select(inp, scheduler.init_state(inp.live.shape[0], torch.device("cpu")))
    return [row.nonzero().flatten().tolist() for row in decision.commit]


# -- threshold: ties pass; tau = 1.0 is the edge where only certain tokens pass --
def test_threshold_ties_pass_and_tau_one_takes_only_certain_tokens():
    inp = with_confidence([[0.9, 0.8999, 1.0, 0.95]])
    assert committed(ThresholdScheduler(0.9), inp) == [[0, 2, 3]]
    assert committed(ThresholdScheduler(1.0), inp) == [[2]]
    assert committed(ThresholdScheduler(1.0), with_confidence([[0.99, 0.999]])) == [[]]  # loop forces one


def test_threshold_on_an_exact_tie_follows_fast_dllm_v1():
    """Fast-dLLM v1 (LLaDA): top-k by confidence, then drop a position whose confidence is
    `< threshold` (the top-1 always stays). Written here from that rule: an exact tie commits;
    the `>` of Fast-dLLM v2 / SDAR / LLaDA2 would not."""
    conf = torch.tensor([[0.5, 0.25, 0.75, 0.5]])                  # exact binary fractions

    def v1(c: torch.Tensor, tau: float) -> list[int]:
        order = torch.argsort(c[0], descending=True, stable=True).tolist()
        return sorted([order[0]] + [i for i in order[1:] if not c[0, i] < tau])

    for tau in (0.5, 0.75, 0.25):
        assert committed(ThresholdScheduler(tau), with_confidence(conf)) == [v1(conf, tau)]
    assert committed(ThresholdScheduler(0.5), with_confidence(conf)) == [[0, 2, 3]]
    assert (conf > 0.5).nonzero()[:, 1].tolist() == [2]            # the strict rule differs here


# -- factor: (n + 1)(1 - c_(n)) <= f on the sorted prefix --
def test_factor_boundary_passes_and_the_last_failure_is_not_committed():
    # f = 1: bars 1 - 1/(n+1) = 0.5 (forced), 0.667, 0.75, 0.8. 0.75 sits on its bar and passes;
    # the last candidate fails, which the reference's off-by-one would still commit.
    inp = with_confidence([[0.1, 0.75, 0.99, 0.9]])
    assert committed(FactorScheduler(1.0), inp) == [[1, 2, 3]]


def test_factor_stops_at_the_first_failure_even_if_later_ones_would_pass():
    # sorted 0.99, 0.6 (< 0.667, fails), 0.6: the prefix ends at n = 1
    assert committed(FactorScheduler(1.0), with_confidence([[0.6, 0.99, 0.6]])) == [[1]]


def test_factor_and_eb_handle_rows_with_nothing_to_commit():
    masked = torch.tensor([[True, True, False], [False, False, False]])
    inp = with_confidence([[0.99, 0.98, 0.97], [0.99, 0.98, 0.97]], masked=masked)
    assert committed(FactorScheduler(), inp) == [[0, 1], []]
    assert committed(EntropyBoundScheduler(), inp)[1] == []


# -- LocalLeap --
def test_local_leap_radius_edge_is_inclusive():
    # anchor at 5 (>= kappa); 0.8 at distances 5, 4, 4, 5 from it
    conf = [[0.8, 0.8, 0.1, 0.1, 0.1, 0.95, 0.1, 0.1, 0.1, 0.8, 0.8]]
    assert committed(LocalLeapScheduler(kappa=0.9, tau=0.75, radius=4), with_confidence(conf)) == [[1, 5, 9]]
    assert committed(LocalLeapScheduler(kappa=0.9, tau=0.75, radius=5), with_confidence(conf)) == [[0, 1, 5, 9, 10]]


def test_local_leap_relaxed_bar_ties_pass_and_propagation_is_one_hop():
    # anchor 0; 0.75 at 2 (== tau, passes); 0.8 at 6 is within radius of 2 but not of the anchor
    conf = [[0.9, 0.1, 0.75, 0.74, 0.1, 0.1, 0.8]]
    assert committed(LocalLeapScheduler(radius=4), with_confidence(conf)) == [[0, 2]]


def test_local_leap_without_anchors_is_the_threshold_rule_at_kappa():
    conf = [[0.89, 0.8, 0.3], [0.91, 0.2, 0.85]]
    leap = committed(LocalLeapScheduler(kappa=0.9), with_confidence(conf))
    assert leap == [[], [0, 2]]


def test_local_leap_ignores_confident_positions_outside_the_block():
    # column 0 is confident but outside the block, so it is no anchor for column 2
    inp = with_confidence([[0.99, 0.1, 0.8, 0.1]], block=[(1, 4)])
    assert committed(LocalLeapScheduler(radius=4), inp) == [[]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, width=32), min_size=1, max_size=24), st.integers(0, 6))
def test_local_leap_lies_between_the_threshold_rules_at_kappa_and_tau(conf, radius):
    inp = with_confidence([conf])
    leap = set(committed(LocalLeapScheduler(kappa=0.9, tau=0.75, radius=radius), inp)[0])
    assert set(committed(ThresholdScheduler(0.9), inp)[0]) <= leap
    assert leap <= set(committed(ThresholdScheduler(0.75), inp)[0])


# -- EB-sampler --
def entropy_input(rows: list[list[list[float]]]):
    """Views from explicit distributions (B, W, V)."""
    return step_input(probs=torch.tensor(rows))


CERTAIN, COIN, DIE = [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]


@pytest.mark.parametrize("gamma, expected", [
    (0.0, [0, 1, 3]),            # sorted: certain (H 0), coin (ln 2), die (ln 4); bounds 0, 0, ln 2
    (math.log(2) - 1e-4, [0, 1, 3]),
    (math.log(2) + 1e-4, [0, 1, 2, 3]),
])
def test_eb_bound_subtracts_the_largest_entropy(gamma, expected):
    # two certain positions tie on confidence: the lower column ranks first
    inp = entropy_input([[CERTAIN, COIN, DIE, CERTAIN]])
    assert committed(EntropyBoundScheduler(gamma), inp) == [expected]


def test_eb_running_max_is_along_the_sequence_not_the_batch():
    # row 1 alone: bounds 0, ln 2 -> one token. A batch-axis cummax would subtract row 0's die
    # entropy (ln 4) instead and let row 1's second coin through (bound 2 ln 2 - ln 4 = 0).
    inp = entropy_input([[DIE, DIE], [COIN, COIN]])
    assert committed(EntropyBoundScheduler(0.01), inp) == [[0], [0]]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 2.0), st.floats(0.0, 2.0))
def test_eb_commits_more_as_gamma_grows_and_everything_at_infinity(seed, a, b):
    logits = torch.randn(2, 9, 7, generator=torch.Generator().manual_seed(seed)) * 2
    inp = step_input(logits, block=[(0, 6), (2, 9)])
    small, large = ({(r, c) for r, row in enumerate(committed(EntropyBoundScheduler(g), inp)) for c in row}
                    for g in sorted((a, b)))
    assert small <= large
    everything = committed(EntropyBoundScheduler(float("inf")), inp)
    assert everything == [row.nonzero().flatten().tolist() for row in inp.eligible]
