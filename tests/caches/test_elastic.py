"""Elastic-Cache: the drift threshold decides which layers are refreshed; forced refresh is exact."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner

from dllm_decode import load_model
from dllm_decode.caches import CACHES, ElasticCache, NoCache
from dllm_decode.cli import main
from dllm_decode.registry import build
from dllm_decode.schedulers import SCHEDULERS
from dllm_decode.testing import probabilities_differ, tiny_block_diffusion, tiny_llada
from tests.caches.helpers import (MASK, PROMPTS, TASK_PROMPTS, assert_batched_equals_alone,
                                  assert_same_decode, config, counts, decode)
from tests.models.conftest import make_dream


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drift_forced_every_step_equals_no_cache(temperature):
    """gamma > 1: every layer counts as drifted at layer 0, so every step is a full recompute."""
    model, cfg = tiny_llada(seed=3, layers=3), config(temperature=temperature)
    runs = [decode(model, cache, cfg=cfg, generator=torch.Generator().manual_seed(7))
            for cache in (ElasticCache(gamma=1.5), NoCache())]
    assert_same_decode(*runs)
    assert all(row == [3, 3, 3] for row in counts(runs[0], "refreshed_layers"))


def test_no_drift_refreshes_no_deep_layer():
    """gamma 0: a cosine of probability rows is never below 0, so after the first (full) forward
    no layer is refreshed and each step recomputes only the fed columns."""
    model = tiny_llada(seed=3, layers=3)
    result = decode(model, ElasticCache(gamma=0.0), cfg=config(stop_at_eos=False))
    refreshed, recomputed = counts(result, "refreshed_layers"), counts(result, "recomputed")
    width = 6 + 16                                                   # longest prompt + gen
    assert refreshed[0] == [3, 3, 3] and recomputed[0] == [width] * 3
    assert all(row == [0, 0, 0] for row in refreshed[1:])
    # a step feeds the previous step's block start to the block end: 8 or 16 columns
    assert all(set(row) <= {8, 16} for row in recomputed[1:]) and len(recomputed) > 2
    differs = [probabilities_differ(c["confidence"], r["confidence"])
               for c, r in zip(result.trace[1:], decode(model, NoCache(), cfg=config(stop_at_eos=False)).trace[1:])]
    assert any(differs)                                              # stale deep K/V really used


def test_default_gamma_refreshes_some_steps_and_reports_per_row():
    model = tiny_llada(seed=3, layers=3)
    result = decode(model, ElasticCache(), cfg=config(stop_at_eos=False))
    refreshed = counts(result, "refreshed_layers")
    assert all(len(row) == 3 and all(0 <= n <= 3 for n in row) for row in refreshed)
    assert {n for row in refreshed[1:] for n in row} - {0}          # some refresh happened
    assert all(step["cache"]["recomputed"].dtype == torch.long for step in result.trace)


@pytest.mark.parametrize("cache", [ElasticCache(), ElasticCache(track_num=4, suffix_window=3),
                                   ElasticCache(gamma=0.0)])
def test_batched_equals_one_by_one(cache):
    assert_batched_equals_alone(tiny_llada(seed=3, layers=3), cache, PROMPTS, config(gen=24))


@pytest.mark.parametrize("scheduler", ["threshold", "low_confidence", "klass", "adaptive_block"])
def test_schedulers_decode_to_the_end(scheduler):
    s = SCHEDULERS[scheduler]()
    cfg = config(s, gen=16, block=5 if s.chooses_block_bounds else 8, stop_at_eos=False)
    result = decode(tiny_llada(seed=5, layers=2), ElasticCache(track_num=2), cfg=cfg)
    assert not (result.tokens == MASK).any() and (result.nfe <= 16).all()


def test_embedded_rows_that_stop_early_leave_the_others_unchanged():
    """Rows stop at their end-of-text at different blocks (rows leave the batch mid-decode)."""
    model = load_model("embedded")
    cfg = config(gen=64, block=16)
    assert_batched_equals_alone(model, ElasticCache(track_num=4), TASK_PROMPTS, cfg)
    result = decode(model, ElasticCache(track_num=4), TASK_PROMPTS, cfg)
    assert result.text[0] == "ella hank mia"


def test_models_it_cannot_run_are_a_one_line_error():
    with pytest.raises(ValueError, match="cache elastic runs the layers itself"):
        decode(make_dream(), ElasticCache())
    with pytest.raises(ValueError, match="cache elastic runs the layers itself"):
        decode(tiny_block_diffusion(), ElasticCache(), cfg=config(gen=8, block=4))


def test_options_parse_and_validate():
    assert build(CACHES, "elastic", {"track_num": "4"}) == ElasticCache(track_num=4)
    assert build(CACHES, "elastic", {"suffix_window": "96"}).suffix_window == 96
    for bad in ({"gamma": "-1"}, {"track_num": "0"}, {"suffix_window": "-2"}):
        with pytest.raises(ValueError):
            build(CACHES, "elastic", bad)


def test_cli_names_it():
    out = CliRunner().invoke(main, ["--model", "tiny", "--cache", "elastic", "-c", "track_num=4",
                                    "--gen-length", "16", "--block-length", "8", "--prompt", "w1 w2", "--json"])
    assert out.exit_code == 0, out.output
    record = json.loads(out.output)
    assert record["config"]["cache"] == {"name": "elastic", "gamma": 0.9, "track_num": 4, "suffix_window": None,
                                       "drift": "keys", "depth_aware": True}


def test_cli_takes_options_inline_and_eval_too(tmp_path):
    out = CliRunner().invoke(main, ["--model", "tiny", "--cache", "elastic:track_num=4,gamma=0.5", "-c",
                                    "gamma=0.7", "--gen-length", "16", "--block-length", "8",
                                    "--prompt", "w1 w2", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["config"]["cache"]["track_num"] == 4
    assert json.loads(out.output)["config"]["cache"]["gamma"] == 0.7          # -c wins
    bad = CliRunner().invoke(main, ["--model", "tiny", "--cache", "elastic:track=4", "--prompt", "w1"])
    assert bad.exit_code == 2 and "unknown option 'track'" in bad.output


def test_trace_has_cache_counts_only_when_the_cache_reports():
    model = tiny_llada(seed=3)
    assert "cache" not in decode(model, NoCache()).trace[0]
    assert set(decode(model, ElasticCache()).trace[0]["cache"]) == {"refreshed_layers", "recomputed"}


def test_drift_on_the_head_axis_is_the_reference_form():
    """drift="heads": per attended key a cosine over heads; gamma 0 never refreshes either way."""
    model = tiny_llada(seed=3, layers=3)
    result = decode(model, ElasticCache(drift="heads", gamma=0.0), cfg=config(stop_at_eos=False))
    assert all(row == [0, 0, 0] for row in counts(result, "refreshed_layers")[1:])
    forced = decode(model, ElasticCache(drift="heads", gamma=1.5))
    assert_same_decode(forced, decode(model, NoCache()))
    with pytest.raises(ValueError, match="drift must be"):
        build(CACHES, "elastic", {"drift": "rows"})


def test_without_depth_awareness_a_drift_refreshes_every_layer():
    model = tiny_llada(seed=3, layers=3)
    result = decode(model, ElasticCache(depth_aware=False), cfg=config(stop_at_eos=False))
    assert {n for row in counts(result, "refreshed_layers") for n in row} <= {0, 3}
    assert {n for row in counts(result, "refreshed_layers")[1:] for n in row} == {0, 3}
