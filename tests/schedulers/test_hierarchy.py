"""dInfer's hierarchy decoder: each contiguous masked segment's best above a low bar, plus a high bar."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.schedulers import HierarchyScheduler, ThresholdScheduler
from tests.schedulers.inputs import with_confidence

INF = float("inf")


def commits(scheduler, conf, **kw) -> list[int]:
    inp = with_confidence([conf], **kw)
    return scheduler.select(inp, None)[0].commit[0].nonzero().flatten().tolist()


def test_no_high_bar_and_low_one_is_the_global_top_one():
    assert commits(HierarchyScheduler(threshold=INF, low_threshold=1.0), [0.3, 0.9, 0.95, 0.2]) == [2]


def test_low_zero_commits_one_per_contiguous_segment_at_its_max():
    masked = torch.tensor([[True, True, False, True, True, True, False, True]])
    conf = [0.3, 0.5, 0.0, 0.2, 0.6, 0.1, 0.0, 0.05]
    assert commits(HierarchyScheduler(threshold=INF, low_threshold=0.0), conf, masked=masked) == [1, 4, 7]


def test_below_the_low_bar_only_the_global_best_commits():
    assert commits(HierarchyScheduler(threshold=0.9, low_threshold=0.62), [0.3, 0.5, 0.4]) == [1]


def test_low_bar_is_strict():
    masked = torch.tensor([[True, False, True]])
    assert commits(HierarchyScheduler(threshold=INF, low_threshold=0.6), [0.6, 0.0, 0.7], masked=masked) == [2]


@pytest.mark.parametrize("seed", range(5))
def test_low_one_with_a_high_bar_is_the_strict_threshold_rule(seed):
    conf = torch.rand(12, generator=torch.Generator().manual_seed(seed)).tolist()
    tau = 0.6
    strict = ThresholdScheduler(float(torch.nextafter(torch.tensor(tau), torch.tensor(1.0))))
    inp = with_confidence([conf])
    expected = strict.select(inp, None)[0].commit | (inp.confidence == inp.confidence.max())
    assert commits(HierarchyScheduler(threshold=tau, low_threshold=1.0), conf) == \
        expected[0].nonzero().flatten().tolist()


def test_tied_segment_maxima_commit_together():
    # the analytic ideal model gives exact ties: every tied maximum of a segment passes (`==`)
    assert commits(HierarchyScheduler(threshold=INF, low_threshold=0.2), [0.25, 0.25, 0.25, 0.25]) == [0, 1, 2, 3]


def test_segments_are_per_row_in_a_batch():
    inp = with_confidence([[0.9, 0.1, 0.8, 0.1], [0.1, 0.7, 0.1, 0.7]],
                          masked=torch.tensor([[True, True, True, True], [True, True, False, True]]))
    commit = HierarchyScheduler(threshold=INF, low_threshold=0.5).select(inp, None)[0].commit
    assert commit[0].nonzero().flatten().tolist() == [0]
    assert commit[1].nonzero().flatten().tolist() == [1, 3]
