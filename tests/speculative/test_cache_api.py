"""The AR mode speaks transformers' cache API: a `Cache` object passed under the keyword the
model's forward declares, so no speculative decode prints transformers' deprecation warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from dllm_decode.speculative import (HeuristicScheduler, LookupDrafter, ModelDrafter, Sampling,
                                     SpecConfig, StagedDrafter, TreeShape, layerskip_drafter,
                                     speculative_generate)
from dllm_decode.speculative.kv import cache_argument, extend, new_kv
from tests.speculative.conftest import MarkovLM, tiny_llama

PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 9, 3]


def test_transformers_models_take_a_cache_object_under_their_declared_keyword():
    from transformers import Cache

    target = tiny_llama(0)
    kv = new_kv(target)
    assert isinstance(kv.cache, Cache)                # never the legacy tuple of (key, value)
    keyword = cache_argument(type(target))
    import inspect

    assert keyword in inspect.signature(type(target).forward).parameters   # no deprecated alias
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logits, kv = extend(target, kv, torch.tensor(PROMPT), 1)
    assert kv.cache.get_seq_length() == len(PROMPT) and logits.shape == (1, 41)


def test_a_forward_without_the_new_keyword_gets_past_key_values():
    assert cache_argument(MarkovLM) == "past_key_values"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("case", ["model", "layerskip", "tree", "lookup", "staged", "plain"])
def test_no_speculative_decode_warns(case, temperature):
    target = tiny_llama(0)
    drafter = {"model": lambda: ModelDrafter(tiny_llama(1, layers=2)),
               "layerskip": lambda: layerskip_drafter(target, "1", runtime="hf"),
               "tree": lambda: ModelDrafter(tiny_llama(1, layers=2), TreeShape(2, 6)),
               "lookup": lambda: LookupDrafter(),
               "staged": lambda: StagedDrafter(ModelDrafter(tiny_llama(1, layers=2)),
                                               layerskip_drafter(tiny_llama(1, layers=2), "1", "hf")),
               "plain": lambda: None}[case]()
    config = SpecConfig(scheduler=HeuristicScheduler(), max_new_tokens=12,
                        sampling=Sampling(temperature=temperature))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # any warning fails the decode
        result = speculative_generate(target, PROMPT, config, drafter,
                                      generator=torch.Generator().manual_seed(0))
    assert len(result.tokens) == 12
