"""Batch invariance, registry-wide, float32 on the CPU: a request's tokens do not depend on what it
is batched with. Each request is decoded alone, then in one running batch with requests of other
prompt lengths (so other padding), admitted in another order, and joining a batch already
decoding; its tokens must be identical every time (0 differing tokens), for every scheduler, and
for every cache on every family that takes it.

This is the server's situation (`Decoding` with one member per request, each with its own
generator), where `generate` of a B-row batch (tests/schedulers/test_contract.py) shares one.

A step's window is shared by every row, so a request joining rows in a later block widens it. The
approximate K/V caches keep each row's own window inside it (`Cache.own_windows`: prefix, dual),
eager and captured; caches with batch-wide state (`Cache.mid_run_joins` False: elastic,
dllm_cache, es, d2, suffix) hold the newcomer until the running rows are done, and the test
checks which of the two happened. The rule here takes a fixed number of steps per block, so no
row waits for another's block; rows that wait under an adaptive rule are tested in
tests/test_row_windows.py.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.engine import check_cache
from dllm_decode.registry import component, registry
from dllm_decode.sampler import Decoding

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10], [11, 12, 13, 14, 15]]
ALONE = [[(i, 0)] for i in range(len(PROMPTS))]
PLANS = {"in order": [(i, 0) for i in range(len(PROMPTS))],
         "reversed": [(i, 0) for i in reversed(range(len(PROMPTS)))],
         "joining later": [(2, 0), (0, 1), (3, 2), (1, 5)]}
"""(prompt index, the step before which it is added): added mid-block, a request joins the running
batch at its next block boundary."""


@functools.cache
def family(name: str):
    from dllm_decode.testing import tiny_block_diffusion, tiny_llada
    from tests.models.conftest import make_dream

    if name == "llada":
        return tiny_llada(seed=3)
    if name == "dream":
        return make_dream(seed=3)
    return tiny_block_diffusion(name, seed=3)


FAMILIES = ("llada", "dream", "fast_dllm", "sdar", "llada2")


def decode(model, config: DecodeConfig, plan, mixed: list | None = None, capture: str = "off") -> dict[int, list[int]]:
    """Each planned request's tokens, decoded in one running batch (own generator, seed = index).
    `mixed` gets, for each step, whether requests that joined at different steps decoded in it."""
    decoding = Decoding(model, config.cache, capture=capture)
    waiting, keys, step, joined = sorted(plan, key=lambda p: p[1]), {}, 0, {}
    while waiting or not decoding.finished:
        while waiting and waiting[0][1] <= step:
            index, _ = waiting.pop(0)
            keys[index] = decoding.add([PROMPTS[index]], config,
                                       generator=torch.Generator().manual_seed(index))
        if not decoding.finished:
            decoding.step()
            live = [m.key for m in decoding.batch.members if m.live]
            for key in live:
                joined.setdefault(key, step)
            if mixed is not None:
                mixed.append(len({joined[key] for key in live}) > 1)
        step += 1
    return {index: decoding.result(key).tokens[0].tolist() for index, key in keys.items()}


def check_invariant(model, config: DecodeConfig, capture: str = "off") -> bool:
    """Asserts the invariance; returns whether a request joined rows already decoding (a cache
    with batch-wide state, `Cache.mid_run_joins` False, holds it until they are done)."""
    alone, mixed = {}, []
    for plan in ALONE:
        alone.update(decode(model, config, plan, capture=capture))
    for name, plan in PLANS.items():
        together = decode(model, config, plan, mixed if name == "joining later" else None, capture)
        differing = {i: (together[i], alone[i]) for i in together if together[i] != alone[i]}
        assert not differing, f"{name}: {differing}"
    return any(mixed)


SLOW_SCHEDULERS = {"apd"}          # loads its verifier model: ~11 s here
FAST_FAMILIES = {"llada", "sdar"}  # a bidirectional and a block-causal family; the rest are slow


def scheduler_params():
    from dllm_decode.schedulers import MASK_SCHEDULERS        # these models' canvases hold [MASK]

    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_SCHEDULERS else n
            for n in sorted(registry("scheduler")) if n in MASK_SCHEDULERS]


def cache_params():
    out = []
    for cache in sorted(registry("cache")):
        for model in FAMILIES:
            marks = [] if model in FAST_FAMILIES else [pytest.mark.slow]
            out.append(pytest.param(cache, model, marks=marks))
    return out


@pytest.mark.parametrize("name", scheduler_params())
def test_every_scheduler(name):
    config = DecodeConfig(scheduler=component("scheduler", name), gen_length=8, block_length=4)
    check_invariant(family("llada"), config)


@pytest.mark.parametrize("cache_name, model_name", cache_params())
def test_every_cache_on_every_family(cache_name, model_name):
    model = family(model_name)
    config = DecodeConfig(scheduler=component("scheduler", "low_confidence"), cache=component("cache", cache_name),
                          gen_length=16, block_length=4)       # four blocks: joins reach rows in block 1 to 3
    try:
        check_cache(model, config)
    except ValueError as err:
        pytest.skip(f"{cache_name} does not run on {model_name}: {err}")
    joined = check_invariant(model, config)
    assert joined == config.cache.mid_run_joins     # the join ran mid-run wherever the cache takes it


@pytest.mark.parametrize("cache_name, model_name", [("prefix", "llada"), ("dual", "llada"), ("dual", "sdar")])
def test_captured_step_keeps_each_rows_own_window(cache_name, model_name):
    """The captured step (static buffers, as `compile` and CUDA graphs run them) keeps each
    row's K/V outside its own window too: a request joins mid-run there as well."""
    config = DecodeConfig(scheduler=component("scheduler", "low_confidence"), cache=component("cache", cache_name),
                          gen_length=16, block_length=4)
    assert check_invariant(family(model_name), config, capture="static")


@pytest.mark.parametrize("model_name", ["llada", "sdar"])
def test_sampled(model_name):
    config = DecodeConfig(scheduler=component("scheduler", "threshold"), gen_length=8, block_length=4,
                          temperature=0.7)
    check_invariant(family(model_name), config)
    check_invariant(family(model_name), dataclasses.replace(config, scheduler=component("scheduler", "random")))


@pytest.mark.parametrize("name", ["uniform_noise", pytest.param("threshold", marks=pytest.mark.slow)])
def test_noise_canvas(name):
    """DiffusionGemma: each request keeps its own encoder cache (its prompt and committed
    canvases at its own positions) and draws its noise from its own generator only while its own
    canvas denoises, so its forward and its draws never see its batch-mates: identical tokens,
    also when it joins a batch whose other requests are on a later canvas."""
    from dllm_decode.testing import tiny_diffusion_gemma

    config = DecodeConfig(scheduler=component("scheduler", name), gen_length=16, block_length=8)
    check_invariant(tiny_diffusion_gemma(seed=3, steps=4), config)


@pytest.mark.parametrize("model_name", ["llada", pytest.param("dream", marks=pytest.mark.slow)])
def test_every_attention_back_end(model_name):
    """A model-side attention back end's per-request state (SparseD's patterns, built at each
    request's own switch step) keeps the invariance: tiles follow positions, not padding, and a
    joining request keeps the running rows' patterns."""
    import copy

    from dllm_decode.models.attention import ATTENTION, set_attention

    for name in ATTENTION:
        model = copy.deepcopy(family(model_name))
        options = {"skip": 0.0, "tile": 2} if name == "sparsed" else {}
        set_attention(model, {"name": name, **options})
        for scheduler in ("low_confidence", "threshold"):
            config = DecodeConfig(scheduler=component("scheduler", scheduler), gen_length=8, block_length=4)
            check_invariant(model, config)
