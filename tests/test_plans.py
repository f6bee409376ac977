"""A cache plans which rows a step computes (`Cache.plan`, pure host-side); an executor runs the
plan: the cache's own eager forward or the captured step. One dispatch decides, per decode and
per phase, and says why when capture was asked for and the decode runs eagerly."""

from __future__ import annotations

import dataclasses
import gc
import warnings
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from dllm_decode.caches import CACHES
from dllm_decode.caches.dual import DualCache
from dllm_decode.capture import CaptureFallback, GraphCache, capture_problem
from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import NoCache, StepPlan
from dllm_decode.sampler import Decoding, generate
from dllm_decode.schedulers import SCHEDULERS, ThresholdScheduler
from dllm_decode.testing import tiny_llada

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


def test_plans_of_the_capturable_caches():
    block, length = (8, 12), 20
    assert NoCache().plan(block, 3, length, 8) == StepPlan((8, 20), rebuild=True, restart=8)
    dual = CACHES["dual"](refresh_every=2, prefix_look=1, after_look=2)
    assert dual.plan(block, 1, length, None).rebuild                 # nothing cached: a refresh
    assert dual.plan(block, 0, length, 8) == StepPlan((8, 20), rebuild=True, restart=8)
    assert dual.plan(block, 1, length, 8) == StepPlan((7, 14), rebuild=False, restart=7)
    assert dual.plan(block, 2, length, 7).rebuild                    # every refresh_every steps
    assert CACHES["prefix"]().plan(block, 1, length, 8) == StepPlan((8, 20), rebuild=False, restart=8)
    assert not CACHES["dual"](block_refresh=False).plan(block, 0, length, 4).rebuild
    exact = CACHES["block"]()
    first = exact.plan((4, 8), 0, length, None)
    assert first == StepPlan((4, 8), rebuild=True, restart=4)
    # the next block re-computes the one just finished (its final tokens) with the new one
    assert exact.plan((8, 12), 0, length, first.restart) == StepPlan((4, 12), rebuild=False, restart=8)


@pytest.mark.parametrize("name", ["d2", "elastic", "suffix", "es"])
def test_data_dependent_caches_declare_they_run_eagerly(name):
    cache = CACHES[name]()
    assert type(cache).capturable is False
    with pytest.raises(NotImplementedError, match="chooses its rows from the data"):
        cache.plan((0, 4), 0, 8, None)


@dataclass(frozen=True)
class RenamedDual(DualCache):
    """A cache of another name and module: captured by what it declares, not by its name."""


@dataclass(frozen=True)
class OptedOut(DualCache):
    capturable: ClassVar[bool] = False


def test_capture_follows_the_declaration_not_the_name():
    model = tiny_llada(layers=2)
    config = DecodeConfig(scheduler=SCHEDULERS["low_confidence"](), cache=RenamedDual(),
                          gen_length=8, block_length=4)
    assert capture_problem(config, model) is None
    assert torch.equal(generate(model, PROMPTS, config, capture="static").tokens,
                       generate(model, PROMPTS, config).tokens)
    with pytest.warns(CaptureFallback, match="OptedOut chooses its rows from the data"):
        decoding = Decoding(model, OptedOut(), capture="static")
    assert decoding.runner is decoding.cache


def test_asking_for_capture_and_getting_eager_says_why_once():
    model = tiny_llada(layers=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Decoding(model, CACHES["d2"](), capture="static")
        Decoding(model, CACHES["dual"](), capture="static")
        Decoding(model, CACHES["d2"]())                      # eager asked: nothing to say
    assert [str(w.message) for w in caught if issubclass(w.category, CaptureFallback)] == [
        "capture 'static' runs eagerly: cache D2Cache chooses its rows from the data (captured: "
        "the caches with a plan: none, prefix, dual, block)"]


class HostRule(ThresholdScheduler):
    capturable = False


def test_the_whole_step_runs_inside_decoding_step():
    """One loop: the whole-step graph is driven by `Decoding.step` (so an `Engine` and the
    server, which step a `Decoding`, get it); a rule that is not capturable runs the captured
    forward with its decision on the host, and `Decoding.fused` says why."""
    model = tiny_llada(layers=2)
    graphs = GraphCache("static")
    fused = DecodeConfig(scheduler=ThresholdScheduler(), cache=CACHES["dual"](), gen_length=8,
                         block_length=4)
    decoding = Decoding(model, fused.cache, capture=graphs)
    key = decoding.add(PROMPTS, fused)
    decoding.step()
    assert decoding.fused is None and graphs.entries and all(k[0] == "step" for k in graphs.entries)
    while not decoding.finished:
        decoding.step()
    assert torch.equal(decoding.result(key).tokens, generate(model, PROMPTS, fused).tokens)
    host = dataclasses.replace(fused, scheduler=HostRule())
    decoding = Decoding(model, host.cache, capture=GraphCache("static"))
    decoding.add(PROMPTS, host)
    decoding.step()
    assert decoding.fused == "scheduler HostRule is not capturable"


def test_a_graph_entry_is_not_reused_for_a_new_owner_at_a_freed_address():
    graphs = GraphCache("static")
    calls = []

    class Owner:
        pass

    def fn(x):
        calls.append(1)
        return x

    owner = Owner()
    graphs.run(("k",), (owner,), (torch.ones(1),), fn=fn)
    graphs.run(("k",), (owner,), (torch.ones(1),), fn=fn)
    assert graphs.captures == 1                               # same owner: the entry is reused
    del owner
    gc.collect()
    graphs.run(("k",), (Owner(),), (torch.ones(1),), fn=fn)
    assert graphs.captures == 2                               # a dead owner never matches


def test_sampling_draws_cover_the_block_not_the_rest_of_the_answer(monkeypatch):
    """A block-view rule draws its rows' noise to their block ends (a (b, block, V) draw per
    step, not (b, rest of the answer, V)); a rule that looks past its block to the answer's end.
    The reference loop draws the same, so sampled decodes still equal it (tests/test_reference.py)."""
    import dllm_decode.ops as ops

    spans: list[int] = []
    original = ops.aligned_uniform

    def spy(start, span, *args, **kwargs):
        spans.append(span)
        return original(start, span, *args, **kwargs)

    monkeypatch.setattr(ops, "aligned_uniform", spy)
    model = tiny_llada(layers=2)
    sampled = dict(gen_length=16, block_length=4, temperature=0.8, stop_at_eos=False)
    generate(model, PROMPTS, DecodeConfig(scheduler=ThresholdScheduler(), **sampled))
    assert spans and max(spans) == 4
    spans.clear()
    generate(model, PROMPTS, DecodeConfig(scheduler=SCHEDULERS["early_commit"](), **sampled))
    assert max(spans) == 16                                  # view = "rest": the whole answer
