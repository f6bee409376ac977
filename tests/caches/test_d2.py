"""d2Cache: which columns a step recomputes (hand-checked), rollout and density by hand, forced
refresh is exact, batching, schedulers, the trace's counts."""

from __future__ import annotations

import pytest
import torch

from dllm_decode import load_model
from dllm_decode.caches import CACHES, D2Cache, NoCache
from dllm_decode.caches.d2 import D2State, _Rollout
from dllm_decode.caches.layerwise import LayerState
from dllm_decode.registry import build
from dllm_decode.schedulers import SCHEDULERS
from dllm_decode.testing import tiny_llada
from tests.caches.helpers import (MASK, PROMPTS, TASK_PROMPTS, assert_batched_equals_alone,
                                  assert_same_decode, config, counts, decode)
from tests.models.conftest import make_dream


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_refresh_every_step_equals_no_cache(temperature):
    model, cfg = tiny_llada(seed=3, layers=3), config(temperature=temperature)
    runs = [decode(model, cache, cfg=cfg, generator=torch.Generator().manual_seed(7))
            for cache in (D2Cache(refresh_k=1), NoCache())]
    assert_same_decode(*runs)
    assert all(row == [3, 3, 3] for row in counts(runs[0], "refreshed_layers"))


def test_cached_steps_recompute_the_fed_range_and_the_chosen_columns():
    """current_k 0, no rollout: a cached step recomputes exactly the previous block start to the
    block end; the first step everything."""
    model = tiny_llada(seed=3, layers=3)
    result = decode(model, D2Cache(current_k=0, rollout_cap=0), cfg=config(stop_at_eos=False))
    recomputed, refreshed = counts(result, "recomputed"), counts(result, "refreshed_layers")
    assert recomputed[0] == [22] * 3 and refreshed[0] == [3] * 3
    assert all(row == [0] * 3 for row in refreshed[1:])
    assert all(set(row) <= {8, 16} for row in recomputed[1:])
    wide = decode(model, D2Cache(current_k=16, rollout_cap=2), cfg=config(stop_at_eos=False))
    extra = [w - n for w, n in zip(sum(counts(wide, "recomputed")[1:], []), sum(recomputed[1:], []))]
    assert max(extra) > 0 and all(0 <= x <= 16 + 2 for x in extra)


def _state(conf, importance, length):
    zeros = [torch.zeros(1, length, 2)]
    return D2State(LayerState(zeros, [torch.zeros(1, 1, length, 2)], [torch.zeros(1, 1, length, 2)]),
                   conf, importance, 0, 0, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))


def test_selection_by_hand():
    """Canvas of 12: prompt 0-3, block 4-7 (fed), masks 8-11. sigma 0: masks by confidence; rollout
    nucleus 0.5 of the committed columns outside the fed range: the top-importance one."""
    masked = torch.tensor([[False] * 4 + [True] * 8])
    conf = torch.tensor([[0.0] * 8 + [0.2, 0.9, 0.5, 0.1]])
    importance = torch.tensor([[0.1, 3.0, 0.5, 0.4] + [9.0] * 8])   # fed/masked columns never count
    cache = D2Cache(current_k=6, rollout_p=0.5, rollout_cap=2, sigma=0.0)
    index, valid = cache._select(_state(conf, importance, 12), masked, torch.ones(1, 12, dtype=torch.bool),
                                 (4, 8), block_masks=4, cut=None)
    assert index[0, :4].tolist() == [4, 5, 6, 7]                   # the fed range first
    assert index[0, 4:6].tolist() == [9, 10]                       # 6 - 4 slots: best masks
    assert index[0, 6:].tolist() == [1, 2] and valid[0].tolist() == [True] * 7 + [False]
    cut, _ = D2Cache(current_k=6, rollout_cap=0, sigma=0.0)._select(
        _state(conf, importance, 12), masked, torch.ones(1, 12, dtype=torch.bool), (4, 8), 4, cut=9)
    assert cut[0, 4].item() == 8                                   # beyond the window: never chosen


def test_density_prefers_masks_next_to_decoded_text():
    decoded = torch.tensor([[True, True, False, False, False, False, False, False]])
    density = D2Cache(sigma=1.0)._density(decoded)[0]
    assert (density[2:].diff() <= 0).all() and density[2] > density[5]


def test_rollout_by_hand():
    """Two layers, every row a query, head-mean attention A (each row of A sums to 1): importance
    = 1^T rownorm(A1 + I) rownorm(A0 + I)."""
    a0 = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])
    a1 = torch.tensor([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])
    rollout = _Rollout(torch.ones(1, 3), None)
    rollout.add(0, a0[:, None])
    rollout.add(1, a1[:, None])
    m0, m1 = (a0[0] + torch.eye(3)) / 2, (a1[0] + torch.eye(3)) / 2
    expected = torch.ones(3) @ m1 @ m0
    torch.testing.assert_close(rollout.importance()[0], expected)
    # the same with query rows 0 and 2 only (row 1 an identity row)
    rows = (torch.tensor([[0, 2]]), torch.tensor([[True, True]]))
    partial = _Rollout(torch.ones(1, 3), rows)
    partial.add(0, a0[:, None, [0, 2]])
    partial.add(1, a1[:, None, [0, 2]])
    m0[1], m1[1] = torch.eye(3)[1], torch.eye(3)[1]
    torch.testing.assert_close(partial.importance()[0], torch.ones(3) @ m1 @ m0)


@pytest.mark.parametrize("cache", [D2Cache(), D2Cache(current_k=12, suffix_window=4, sigma=2.0)])
def test_batched_equals_one_by_one(cache):
    """(Not with `refresh_k`: the period counts the batch's steps, see the docstring.)"""
    assert_batched_equals_alone(tiny_llada(seed=3, layers=3), cache, PROMPTS, config(gen=24))


@pytest.mark.parametrize("scheduler", ["threshold", "low_confidence", "eb", "adaptive_block"])
def test_schedulers_decode_to_the_end(scheduler):
    s = SCHEDULERS[scheduler]()
    cfg = config(s, gen=16, block=5 if s.chooses_block_bounds else 8, stop_at_eos=False)
    result = decode(tiny_llada(seed=5), D2Cache(current_k=12), cfg=cfg)
    assert not (result.tokens == MASK).any() and (result.nfe <= 16).all()


def test_embedded_rows_that_stop_early_leave_the_others_unchanged():
    model = load_model("embedded")
    cfg = config(gen=64, block=16)
    assert_batched_equals_alone(model, D2Cache(suffix_window=16), TASK_PROMPTS, cfg)
    assert decode(model, D2Cache(), TASK_PROMPTS, cfg).text[0] == "ella hank mia"


def test_refuses_dream_and_validates_options():
    with pytest.raises(ValueError, match="cache d2 runs the layers itself"):
        decode(make_dream(), D2Cache())
    assert build(CACHES, "d2", {"suffix_window": "96", "refresh_k": "8"}) == D2Cache(suffix_window=96, refresh_k=8)
    for bad in ({"current_k": "-1"}, {"rollout_p": "2"}, {"sigma": "-1"}, {"refresh_k": "0"}):
        with pytest.raises(ValueError):
            build(CACHES, "d2", bad)
