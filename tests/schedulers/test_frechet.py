"""Fast-dLLM++'s Fréchet-profile rule: the sorted prefix with G_n = sum c + c_(n) - n > margin."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_decode.schedulers import FactorScheduler, FrechetScheduler
from tests.schedulers.inputs import with_confidence


def count(scheduler, conf) -> int:
    return int(scheduler.select(with_confidence([conf]), None)[0].commit.sum())


@pytest.mark.parametrize("c", [0.97, 0.93, 0.87, 0.77, 0.63])
@pytest.mark.parametrize("margin", [0.03, 0.13, 0.27, 0.47])
def test_equal_confidences_give_the_factor_rule_at_one_minus_margin(c, margin):
    conf = [c] * 12
    # off the boundary (n + 1)(1 - c) == 1 - margin the two counts agree
    n = torch.arange(1, 13)
    assert not torch.isclose((n + 1) * (1 - c), torch.tensor(1 - margin)).any()
    assert count(FrechetScheduler(margin), conf) == count(FactorScheduler(1 - margin), conf)


@settings(max_examples=60, deadline=None)
@given(conf=st.lists(st.floats(0.01, 0.999), min_size=1, max_size=12), margin=st.sampled_from([0.0, 0.1, 0.25]))
def test_commits_at_least_the_factor_rule_a_confidence_prefix_and_one(conf, margin):
    frechet = FrechetScheduler(margin).select(with_confidence([conf]), None)[0].commit[0]
    n = int(frechet.sum())
    assert n >= 1
    assert n >= count(FactorScheduler(1 - margin), conf) - 1      # -1: a boundary tie may go either way
    ranked = sorted(range(len(conf)), key=lambda i: (-conf[i], i))
    assert sorted(frechet.nonzero().flatten().tolist()) == sorted(ranked[:n])


def test_g_is_the_frechet_gap_and_the_bar_is_strict():
    # G_2 = 0.9 + 0.8 + 0.8 - 2 = 0.5: passes at margin 0.49, fails at 0.5
    assert count(FrechetScheduler(0.49), [0.9, 0.8]) == 2
    assert count(FrechetScheduler(0.5), [0.9, 0.8]) == 1


def test_heterogeneity_bonus_commits_more_than_factor():
    # c = (1.0, 0.7): G_2 = 1.7 + 0.7 - 2 = 0.4 > 0.25; factor 0.75 needs 3 * 0.3 = 0.9 <= 0.75: no
    assert count(FrechetScheduler(0.25), [1.0, 0.7]) == 2
    assert count(FactorScheduler(0.75), [1.0, 0.7]) == 1


def test_margin_one_is_one_token_per_step():
    assert count(FrechetScheduler(1.0), [1.0, 1.0, 1.0]) == 1


def test_negative_margin_is_refused():
    with pytest.raises(ValueError, match="margin must be >= 0"):
        FrechetScheduler(-0.1)
