"""dLLM-Cache: recomputing every layer every step is `none`; frozen features stay frozen; the
partial refresh recomputes int(G * ratio) columns; batching; the one-line refusal elsewhere."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.caches import DLLMCache, NoCache
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler
from dllm_decode.testing import probabilities_differ, tiny_llada
from tests.caches.helpers import (PROMPTS, assert_batched_equals_alone, assert_same_decode, config,
                                  counts, decode)
from tests.models.conftest import make_dream


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_interval_one_equals_no_cache(temperature):
    model, cfg = tiny_llada(seed=3, layers=3), config(temperature=temperature)
    runs = [decode(model, cache, cfg=cfg, generator=torch.Generator().manual_seed(7))
            for cache in (DLLMCache(prompt_every=1, gen_every=1), NoCache())]
    assert_same_decode(*runs)
    assert all(row == [3, 3, 3] for row in counts(runs[0], "refreshed_layers"))


def test_the_first_layer_alone_is_exact_and_more_layers_are_not():
    """A one-layer model with layer 0 always recomputed is `none`; with three layers the cached
    steps' confidences differ from `none`'s."""
    cfg = config(LowConfidenceScheduler(), stop_at_eos=False)
    runs = [decode(tiny_llada(seed=3, layers=1), cache, cfg=cfg) for cache in (DLLMCache(), NoCache())]
    assert_same_decode(*runs)
    deep = [decode(tiny_llada(seed=3, layers=3), cache, cfg=cfg) for cache in (DLLMCache(), NoCache())]
    assert any(probabilities_differ(a["confidence"], b["confidence"])
               for a, b in zip(deep[0].trace, deep[1].trace))


def test_refresh_schedule_and_partial_counts():
    """gen 16, prompt 3: step 0 full, the response every 7 steps (16 columns), int(16 x 0.25) = 4
    columns otherwise; the first layer is always full."""
    cfg = config(LowConfidenceScheduler(), stop_at_eos=False)
    result = decode(tiny_llada(seed=3, layers=3), DLLMCache(), prompts=[PROMPTS[0]], cfg=cfg)
    recomputed, refreshed = [r[0] for r in counts(result, "recomputed")], [r[0] for r in counts(result, "refreshed_layers")]
    assert recomputed[0] == 19 and refreshed[0] == 3
    assert [recomputed[t] for t in (7, 14)] == [16, 16] and refreshed[7] == 1
    assert all(recomputed[t] == 4 for t in range(1, 16) if t % 7)
    none = decode(tiny_llada(seed=3, layers=3), DLLMCache(ratio=0.0), prompts=[PROMPTS[0]], cfg=cfg)
    assert all(r[0] == 0 for t, r in enumerate(counts(none, "recomputed")) if t % 7)


def test_batched_equals_one_by_one():
    """The refresh schedule counts the batch's steps (as the reference's), so rows match alone
    when they take the same steps (a fixed count per step) or when the response is recomputed
    every step (any rule)."""
    model = tiny_llada(seed=3, layers=2)
    fixed = config(LowConfidenceScheduler(steps_per_block=4), stop_at_eos=False)
    assert_batched_equals_alone(model, DLLMCache(gen_every=3), PROMPTS, fixed)
    assert_batched_equals_alone(model, DLLMCache(gen_every=1), PROMPTS, config(ThresholdScheduler(0.3)))


def test_other_families_are_refused_in_one_line():
    with pytest.raises(ValueError, match="cache dllm_cache .*LLaDA layout"):
        DLLMCache().init_state(make_dream())


@pytest.mark.parametrize("bad, match", [({"prompt_every": 0}, "prompt_every"), ({"gen_every": 0}, "gen_every"),
                                        ({"ratio": 1.5}, "ratio")])
def test_bad_options_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        DLLMCache(**bad)
