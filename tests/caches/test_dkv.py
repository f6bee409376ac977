"""dKV-Cache: a refresh every step is `none`; cached steps recompute exactly the masks and the
last step's commits; batching; the one-line refusal elsewhere."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.caches import DKVCache, NoCache
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler
from dllm_decode.testing import tiny_llada
from tests.caches.helpers import (PROMPTS, assert_batched_equals_alone, assert_same_decode, config,
                                  counts, decode)
from tests.models.conftest import make_dream


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_refresh_every_step_equals_no_cache(temperature):
    model, cfg = tiny_llada(seed=3, layers=3), config(temperature=temperature)
    runs = [decode(model, cache, cfg=cfg, generator=torch.Generator().manual_seed(7))
            for cache in (DKVCache(refresh_every=1), NoCache())]
    assert_same_decode(*runs)


def test_cached_steps_recompute_the_masks_and_the_last_commits():
    """One token per step, block 8, refreshes at block steps 0, 1 and 8: a cached step at block
    step t recomputes the block's 8 - t masks, the 8 masks of the next block (if any) and the
    one column decoded at the last step."""
    cfg = config(LowConfidenceScheduler(), stop_at_eos=False)
    result = decode(tiny_llada(seed=3, layers=2), DKVCache(), prompts=[PROMPTS[0]], cfg=cfg)
    recomputed, refreshed = counts(result, "recomputed"), counts(result, "refreshed_layers")
    assert [r[0] for r in refreshed] == [2, 2, 0, 0, 0, 0, 0, 0] * 2
    want = [8 - t + 8 + 1 for t in range(2, 8)] + [8 - t + 1 for t in range(2, 8)]
    got = [r[0] for r, f in zip(recomputed, refreshed) if f[0] == 0]
    assert got == want


def test_a_longer_delay_recomputes_more():
    cfg = config(LowConfidenceScheduler(), stop_at_eos=False)
    model = tiny_llada(seed=3, layers=2)
    one = counts(decode(model, DKVCache(), prompts=[PROMPTS[0]], cfg=cfg), "recomputed")
    three = counts(decode(model, DKVCache(delay=3), prompts=[PROMPTS[0]], cfg=cfg), "recomputed")
    assert sum(r[0] for r in three) > sum(r[0] for r in one)


def test_batched_equals_one_by_one_with_different_commit_counts():
    cfg = config(ThresholdScheduler(0.3))
    assert_batched_equals_alone(tiny_llada(seed=3, layers=2), DKVCache(refresh_every=4), PROMPTS, cfg)


def test_other_families_are_refused_in_one_line():
    with pytest.raises(ValueError, match="cache dkv .*LLaDA layout"):
        DKVCache().init_state(make_dream())


@pytest.mark.parametrize("bad, match", [({"refresh_every": 0}, "refresh_every"), ({"delay": -1}, "delay")])
def test_bad_options_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        DKVCache(**bad)
