"""Suffix pruning: the kept columns by hand (window, DPad's distance decay), pruned columns never
reach the logits, a window over the whole canvas equals `none`, batching, schedulers, report."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_decode import load_model
from dllm_decode.caches import CACHES, NoCache, SuffixCache
from dllm_decode.config import accepts_cache
from dllm_decode.registry import build
from dllm_decode.schedulers import MASK_SCHEDULERS, SCHEDULERS
from dllm_decode.testing import OracleMaskPredictor, tiny_llada
from tests.caches.helpers import (MASK, PROMPTS, TASK_PROMPTS, assert_batched_equals_alone,
                                  assert_same_decode, config, counts, decode)


def test_window_keeps_the_block_the_first_suffix_columns_and_the_tail():
    kept = SuffixCache(window=3).kept(block_end=5, length=12, device=torch.device("cpu"))
    assert kept.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 11]
    assert SuffixCache(window=3, tail_keep=2).kept(5, 12, torch.device("cpu")).tolist()[-2:] == [10, 11]
    assert SuffixCache(window=20).kept(5, 12, torch.device("cpu")).tolist() == list(range(12))
    assert SuffixCache(window=0, tail_keep=0).kept(5, 12, torch.device("cpu")).tolist() == [0, 1, 2, 3, 4]


def test_dpad_keeps_near_columns_more_often_and_none_past_its_window():
    cache = SuffixCache(mode="dpad", k=4.0, scale=2.0, dpad_window=256)
    keep_prob = [2.0 * math.exp(-0.5 * x ** 2) / math.sqrt(2 * math.pi) for x in torch.linspace(0, 4, 256).tolist()]
    assert keep_prob[0] == pytest.approx(0.80, abs=0.01) and keep_prob[64] == pytest.approx(0.48, abs=0.01)
    hits = torch.zeros(300)
    for seed in range(200):
        kept = SuffixCache(mode="dpad", seed=seed).kept(32, 332, torch.device("cpu"))
        assert kept[:32].tolist() == list(range(32))
        hits[kept[32:] - 32] += 1
    assert hits[256:].sum() == 0                                  # nothing past dpad_window
    assert hits[:16].mean() / 200 == pytest.approx(0.78, abs=0.06)
    assert hits[:256].sum() / 200 == pytest.approx(sum(keep_prob), rel=0.05)  # ~64 kept per draw
    again = cache.kept(32, 332, torch.device("cpu"))
    assert torch.equal(again, cache.kept(32, 332, torch.device("cpu")))   # seeded: runs repeat


@pytest.mark.parametrize("kv", ["none", "prefix", "dual"])
def test_pruned_columns_never_reach_the_logits(kv):
    """The oracle puts its probabilities by position; a model that reads the canvas would see a
    changed token past the window: tiny LLaDA logits of the block do not change when the pruned
    suffix (all [MASK]) is replaced by other tokens."""
    model, cache = tiny_llada(seed=3, layers=2), SuffixCache(window=2, kv=kv)
    canvas = torch.tensor([[1, 2, 3] + [MASK] * 12])
    logits, offset, _ = cache.logits(model, canvas, None, (3, 7), 0, None)
    changed = canvas.clone()
    changed[0, 9:14] = 5                                          # pruned: 9..13 (kept: 7, 8, 14)
    same, _, _ = cache.logits(model, changed, None, (3, 7), 0, None)
    assert offset == 3 and logits.shape[1] == 4
    torch.testing.assert_close(logits, same)
    changed[0, 14] = 5                                            # the kept tail does matter
    assert not torch.allclose(logits, cache.logits(model, changed, None, (3, 7), 0, None)[0])


def test_window_over_the_whole_canvas_equals_no_cache():
    model = tiny_llada(seed=3, layers=3)
    assert_same_decode(decode(model, SuffixCache(window=64)), decode(model, NoCache()))


@pytest.mark.parametrize("cache", [SuffixCache(window=3), SuffixCache(window=3, kv="prefix"),
                                   SuffixCache(window=2, kv="dual"),
                                   SuffixCache(mode="dpad", k=2.0, dpad_window=16)])
def test_batched_equals_one_by_one(cache):
    assert_batched_equals_alone(tiny_llada(seed=3, layers=3), cache, PROMPTS, config(gen=24))


@pytest.mark.parametrize("scheduler", sorted(MASK_SCHEDULERS))
def test_every_scheduler_decodes_to_the_end(scheduler):
    s = SCHEDULERS[scheduler]()
    cfg = config(s, gen=24, block=5 if s.chooses_block_bounds else 8, stop_at_eos=False)
    if not accepts_cache(s, "suffix"):
        pytest.skip("the rule refuses this cache (e.g. takes back earlier blocks; refused by the loop)")
    result = decode(tiny_llada(seed=5), SuffixCache(window=4, kv="prefix"), cfg=cfg,
                    generator=torch.Generator().manual_seed(0))
    assert not (result.tokens == MASK).any()


def test_report_counts_the_fed_columns():
    """Canvas 22 (prompt 6, gen 16, block 8), window 3, tail 1, kv=dual: a block start is a full
    forward of the pruned canvas (both layers, every kept column), a later step feeds the block."""
    model = tiny_llada(seed=3, layers=2)
    result = decode(model, SuffixCache(window=3, kv="dual"), cfg=config(stop_at_eos=False))
    fed, refreshed = counts(result, "recomputed"), counts(result, "refreshed_layers")
    starts = [step["block_step"] == 0 for step in result.trace]
    assert fed[0] == [14 + 3 + 1] * 3 and refreshed[0] == [2] * 3          # columns 0..13, 14..16, 21
    second = starts.index(True, 1)
    assert fed[second] == [22] * 3                                         # the last block: no suffix
    assert all(row == [8] * 3 for row, first in zip(fed, starts) if not first)
    assert all(row == [0] * 3 for row, first in zip(refreshed, starts) if not first)


def test_embedded_rows_that_stop_early_leave_the_others_unchanged():
    model = load_model("embedded")
    for cache in (SuffixCache(window=16), SuffixCache(mode="dpad", kv="prefix")):
        assert_batched_equals_alone(model, cache, TASK_PROMPTS, config(gen=64, block=16))
    assert decode(model, SuffixCache(), TASK_PROMPTS, config(gen=64, block=16)).text[0] == "ella hank mia"


def test_options_validate_and_kv_needs_a_kv_model():
    assert build(CACHES, "suffix", {"mode": "dpad"}) == SuffixCache(mode="dpad")
    for bad in ({"mode": "x"}, {"kv": "x"}, {"window": "-1"}, {"k": "0"}):
        with pytest.raises(ValueError):
            build(CACHES, "suffix", bad)
    oracle = OracleMaskPredictor(torch.arange(4), torch.full((4,), 0.5), 37, MASK, 35)
    with pytest.raises(ValueError, match="suffix:kv=none"):
        decode(oracle, SuffixCache(kv="prefix"), [[1]], config(gen=4, block=4))
    assert not (decode(oracle, SuffixCache(window=1), [[1]], config(gen=4, block=2)).tokens == MASK).any()
