"""ES-dLLM early skipping: no skipping is the dual cache (and, refreshed every step, `none`); only
columns that reach the last layer are eligible; the frontier column always does; the per-layer
counts; batching; the one-line refusal elsewhere."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.caches import DualCache, EarlySkipCache, NoCache
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler
from dllm_decode.testing import probabilities_differ, tiny_llada
from tests.caches.helpers import (PROMPTS, assert_batched_equals_alone, assert_same_decode, config,
                                  counts, decode)
from tests.models.conftest import make_dream

NO_SKIP = dict(proportions="1@0", suffix="refresh")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_no_skipping_is_the_dual_cache_and_every_step_refreshed_is_none(temperature):
    model, cfg = tiny_llada(seed=3, layers=3), config(temperature=temperature)
    run = lambda cache: decode(model, cache, cfg=cfg, generator=torch.Generator().manual_seed(7))  # noqa: E731
    assert_same_decode(run(EarlySkipCache(**NO_SKIP)), run(DualCache()))
    assert_same_decode(run(EarlySkipCache(**NO_SKIP, prompt_every=1)), run(NoCache()))


def test_skipping_counts_and_only_fresh_columns_are_eligible():
    """3 layers, blocks of 8: layer 1 is the skip layer (shares 1, 0.25, 0.25), so a cached step
    runs layers 0-1 on the 8 block columns and keeps max(int(0.25 x 8), 1 + 2) = 3 per row;
    block starts refresh in full. Each skipping step leaves each busy row between 1 (the
    frontier) and 3 eligible columns, where the dual cache leaves every masked block column."""
    model, cfg = tiny_llada(seed=3, layers=3), config(LowConfidenceScheduler(), stop_at_eos=False)
    result = decode(model, EarlySkipCache(), cfg=cfg)
    recomputed, refreshed = counts(result, "recomputed"), counts(result, "refreshed_layers")
    starts = [t for t, step in enumerate(result.trace) if step["block_step"] == 0]
    assert starts == [0, 8]
    for t, step in enumerate(result.trace):
        eligible = step["confidence"].isfinite().sum(-1)
        if t in starts:
            assert refreshed[t] == [3, 3, 3] and (eligible == 8).all()
        else:
            assert refreshed[t] == [2, 2, 2] and recomputed[t] == [3, 3, 3]
            assert ((eligible >= 1) & (eligible <= 3)).all(), (t, eligible)
    dual = decode(model, DualCache(), cfg=cfg)
    assert [int(s["confidence"].isfinite().sum(-1).max()) for s in dual.trace[1:8]] == list(range(7, 0, -1))


def test_the_frontier_column_always_reaches_the_last_layer():
    """A direct call: the leftmost masked block column of each row is fresh on a skipping step,
    even when every other column scores higher."""
    model, cache = tiny_llada(seed=3, layers=3), EarlySkipCache(bonus_top2=9.0, bonus_frontier=5.0)
    canvas = torch.randint(0, 30, (2, 20), generator=torch.Generator().manual_seed(3))
    canvas[:, 4:] = model.mask_token_id
    with torch.inference_mode():
        _, _, state = cache.logits(model, canvas, None, (4, 12), 0, None)
        canvas[0, 4] = canvas[1, 5] = 7                       # row 0's frontier moves to 5, row 1's stays 4
        logits, offset, state = cache.logits(model, canvas, None, (4, 12), 1, state)
    fresh = cache.fresh(state)
    assert offset == 4 and fresh.shape == (2, 8) and fresh.sum(-1).tolist() == [3, 3]
    assert fresh[0, 1] and fresh[1, 0]
    assert (logits[~fresh] == 0).all() and (logits[fresh] != 0).any(-1).all()


def test_skipping_changes_the_decode_and_the_default_is_the_stale_suffix():
    cfg = config(LowConfidenceScheduler(), stop_at_eos=False)
    model = tiny_llada(seed=3, layers=3)
    skipped, dual = decode(model, EarlySkipCache(), cfg=cfg), decode(model, DualCache(), cfg=cfg)
    assert any(probabilities_differ(a["confidence"], b["confidence"]) for a, b in zip(skipped.trace, dual.trace))
    # three blocks: at the second block's start the stale suffix (the third block) keeps the
    # K/V of the first call, where the dual cache recomputes it
    cfg = config(LowConfidenceScheduler(), gen=24, stop_at_eos=False)
    stale, dual = decode(model, EarlySkipCache(proportions="1@0"), cfg=cfg), decode(model, DualCache(), cfg=cfg)
    assert [s["offset"] for s in stale.trace] == [s["offset"] for s in dual.trace]
    assert not any(probabilities_differ(a["confidence"], b["confidence"]) for a, b in zip(stale.trace[:8], dual.trace[:8]))
    assert any(probabilities_differ(a["confidence"], b["confidence"]) for a, b in zip(stale.trace[8:], dual.trace[8:]))


@pytest.mark.parametrize("signal", ["hidden", "key", "query"])
def test_batched_equals_one_by_one(signal):
    model = tiny_llada(seed=3, layers=3)
    assert_batched_equals_alone(model, EarlySkipCache(signal=signal), PROMPTS,
                                config(LowConfidenceScheduler(steps_per_block=4), stop_at_eos=False))
    assert_batched_equals_alone(model, EarlySkipCache(signal=signal), PROMPTS, config(ThresholdScheduler(0.3)))


def test_other_families_are_refused_in_one_line():
    with pytest.raises(ValueError, match="cache es .*LLaDA layout") as err:
        EarlySkipCache().init_state(make_dream())
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad, match", [({"proportions": "0.5@0"}, "start with 1@0"),
                                        ({"proportions": "1@0,0.5@0.5,0.75@0.75"}, "never grow"),
                                        ({"proportions": "1@0,half"}, "share@depth"),
                                        ({"signal": "attention"}, "signal"), ({"suffix": "drop"}, "suffix"),
                                        ({"alpha": 1.5}, "alpha"), ({"full_every": 0}, "full_every"),
                                        ({"prompt_every": -1}, "prompt_every"), ({"min_extra": -1}, "min_extra")])
def test_bad_options_are_one_line_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        EarlySkipCache(**bad)
