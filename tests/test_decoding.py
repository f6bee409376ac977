"""`Decoding` as a running batch: requests with their own configs, generators and lengths join
between blocks and leave when done, each decoding exactly as it would alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, Decoding, generate
from dllm_decode.caches import DualCache, PrefixCache
from dllm_decode.filters import EoTPFilter
from dllm_decode.interfaces import NoCache
from dllm_decode.schedulers import LowConfidenceScheduler, RandomScheduler, ThresholdScheduler
from dllm_decode.testing import tiny_llada

MASK = 36

REQUESTS = [
    ([[1, 2, 3], [4, 5]], DecodeConfig(ThresholdScheduler(0.3), gen_length=16, block_length=8)),
    ([[6, 7, 8, 9, 10, 11]], DecodeConfig(LowConfidenceScheduler(steps_per_block=2), gen_length=24,
                                          block_length=4)),
    ([[12]], DecodeConfig(ThresholdScheduler(0.5), gen_length=8, block_length=8, stop_at_eos=False)),
    ([[13, 14], [15, 16, 17]], DecodeConfig(RandomScheduler(), gen_length=12, block_length=4,
                                            temperature=1.0, seed=5)),
]


def run_busy(model, requests, cache=NoCache(), join_after=(0, 2, 3, 5)):
    """Start with the first request, let the others join after the given numbers of steps."""
    decoding = Decoding(model, cache)
    done, steps, waiting = {}, 0, list(enumerate(requests))
    while waiting or not decoding.finished:
        while waiting and join_after[waiting[0][0]] <= steps:
            i, (prompts, config) = waiting.pop(0)
            decoding.add(prompts, dataclasses.replace(config, cache=cache), key=f"r{i}")
        for key in decoding.step():
            done[key] = decoding.result(key)
        steps += 1
    return done


@pytest.mark.parametrize("cache", [NoCache(), DualCache(refresh_every=1), PrefixCache(refresh_every=1)])
def test_every_request_decodes_as_it_would_alone(cache):
    model = tiny_llada(seed=2)
    busy = run_busy(model, REQUESTS, cache)
    assert sorted(busy) == [f"r{i}" for i in range(len(REQUESTS))]
    for i, (prompts, config) in enumerate(REQUESTS):
        alone = generate(model, prompts, dataclasses.replace(config, cache=cache))
        assert torch.equal(busy[f"r{i}"].tokens, alone.tokens), i
        assert torch.equal(busy[f"r{i}"].nfe, alone.nfe), i


def test_joining_with_truncation_and_traces():
    model = tiny_llada(seed=4)
    config = DecodeConfig(ThresholdScheduler(0.2), filters=(EoTPFilter(mode="predicted", eos_threshold=0.05),),
                          gen_length=16, block_length=8)
    alone = [generate(model, [[i, i + 1]], config, trace=True) for i in (1, 5)]
    decoding = Decoding(model, NoCache(), trace=True)
    decoding.add([[1, 2]], config, key="a")
    decoding.step()
    while decoding.block_step:                         # joins only between blocks
        decoding.step()
    decoding.add([[5, 6]], config, key="b")
    results = {}
    while not decoding.finished:
        for key in decoding.step():
            results[key] = decoding.result(key)
    for key, reference in zip("ab", alone):
        assert torch.equal(results[key].tokens, reference.tokens)
        assert len(results[key].trace) == len(reference.trace)


def test_snapshot_streams_a_growing_final_prefix():
    model = tiny_llada(seed=3)
    config = DecodeConfig(LowConfidenceScheduler(), gen_length=12, block_length=4, stop_at_eos=False)
    decoding = Decoding(model, NoCache())
    decoding.add([[1, 2, 3]], config, key="s")
    seen = []
    while not decoding.finished:
        decoding.step()
        tokens, final = decoding.snapshot("s")
        seen.append((tokens.clone(), int(final[0])))
    lengths = [n for _, n in seen]
    assert lengths == sorted(lengths) and lengths[-1] == 12
    end = seen[-1][0][0]
    for tokens, n in seen:                             # a final prefix never changes afterwards
        assert torch.equal(tokens[0, :n], end[:n])
    assert torch.equal(decoding.result("s").tokens[0], end)


def test_cancel_frees_the_rows_and_leaves_others_alone():
    model = tiny_llada(seed=2)
    (p0, c0), (p1, c1) = REQUESTS[0], REQUESTS[1]
    decoding = Decoding(model, NoCache())
    decoding.add(p0, c0, key="keep")
    decoding.add(p1, c1, key="drop")
    decoding.step()
    decoding.cancel("drop")
    finished = []
    while not decoding.finished:
        finished += decoding.step()
    assert finished == ["keep"]
    assert torch.equal(decoding.result("keep").tokens, generate(model, p0, c0).tokens)
    with pytest.raises(KeyError):
        decoding.result("drop")


def test_cancelling_the_only_busy_request_mid_block_ends_the_phase():
    """Cancelling the last rows with work left in a block (the others idle or none) must end the
    phase: the next step admits newcomers instead of stepping an empty table."""
    model = tiny_llada(seed=2)
    (p0, c0), (p1, c1) = REQUESTS[0], REQUESTS[1]
    decoding = Decoding(model, NoCache())
    decoding.add(p1, c1, key="drop")
    decoding.step()                                   # mid-block: one of two steps taken
    decoding.cancel("drop")
    decoding.add(p0, c0, key="late")
    finished = []
    while not decoding.finished:
        finished += decoding.step()
    assert finished == ["late"]
    assert torch.equal(decoding.result("late").tokens, generate(model, p0, c0).tokens)


def test_a_request_needs_the_batch_cache_and_a_fresh_key():
    decoding = Decoding(tiny_llada(), NoCache())
    decoding.add([[1]], DecodeConfig(ThresholdScheduler(), gen_length=8, block_length=8), key="x")
    with pytest.raises(ValueError, match="needs a batch of its own"):
        decoding.add([[1]], DecodeConfig(ThresholdScheduler(), cache=DualCache(), gen_length=8,
                                         block_length=8))
    with pytest.raises(ValueError, match="already in use"):
        decoding.add([[2]], DecodeConfig(ThresholdScheduler(), gen_length=8, block_length=8), key="x")
