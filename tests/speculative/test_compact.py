"""`CompactCausalLM` reproduces the transformers Llama it is built from: logits (whole sequence,
incremental through its cache, after crops, past its initial capacity, GQA and attention
biases), greedy decoding through the AR loop, and a clear refusal for other architectures."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.speculative import (CompactCausalLM, ModelDrafter, SpecConfig, layerskip_drafter,
                                     speculative_generate, with_runtime)
from dllm_decode.speculative.compact import CompactCache, resolve_runtime
from dllm_decode.speculative.kv import extend, feed, new_kv, rollback
from dllm_decode.schedulers import ThresholdScheduler
from tests.speculative.conftest import VOCAB, MarkovLM, tiny_llama

TOL = dict(atol=1e-4, rtol=1e-4)


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids.unsqueeze(0)).logits[0]


@pytest.mark.parametrize("bias", [False, True])
def test_whole_sequence_logits_match(bias):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=48, attention_bias=bias,
                         rope_theta=500.0)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, VOCAB, (30,))
    compact = CompactCausalLM(model)
    with torch.inference_mode():
        got = compact(ids.unsqueeze(0)).logits[0]
    torch.testing.assert_close(got, hf_logits(model, ids), **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_rows_and_dtypes_match(target, dtype):
    model = tiny_llama(0).to(dtype)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    compact = CompactCausalLM(model)
    cache = compact.new_cache(batch=2)
    first = compact(ids[:, :5], cache=cache).logits
    rest = compact(ids[:, 5:], cache=cache).logits
    with torch.inference_mode():
        reference = model(input_ids=ids).logits
    tol = TOL if dtype == torch.float32 else dict(atol=0.05, rtol=0.02)   # bf16: ~3 digits; logits ~3
    torch.testing.assert_close(torch.cat([first, rest], 1).float(), reference.float(), **tol)
    assert first.dtype == dtype


def test_incremental_feeds_crops_and_growth_match(target):
    compact = CompactCausalLM(target)
    ids = torch.randint(0, VOCAB, (300,), generator=torch.Generator().manual_seed(0))
    reference = hf_logits(target, ids)
    kv = new_kv(compact)
    logits, kv = feed(compact, kv, ids[:7], 7)
    torch.testing.assert_close(logits, reference[:7], **TOL)
    logits, kv = feed(compact, kv, ids[7:12], 2)                 # several tokens after a cache
    torch.testing.assert_close(logits, reference[10:12], **TOL)
    kv = rollback(kv, 9)                                         # drop 3 positions, then refeed
    assert kv.cache.get_seq_length() == 9
    other = torch.tensor([1, 2, 3])
    logits, kv = feed(compact, kv, other, 3)
    torch.testing.assert_close(logits, hf_logits(target, torch.cat([ids[:9], other]))[9:], **TOL)
    logits, kv = extend(compact, kv, ids, 1)                     # past the 256-position buffer
    torch.testing.assert_close(logits, reference[-1:], **TOL)
    assert kv.cache.get_seq_length() == 300


def test_layer_subset_matches_transformers_subset(target):
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(1))
    compact = layerskip_drafter(target, "0,2", "compact").model
    reference = layerskip_drafter(target, "0,2", "hf").model
    assert isinstance(compact, CompactCausalLM) and len(compact.layers) == 2
    with torch.inference_mode():
        torch.testing.assert_close(compact(ids.unsqueeze(0)).logits[0], hf_logits(reference, ids), **TOL)


def test_compact_target_and_draft_decode_as_transformers(target, draft_model):
    prompt = [3, 17, 5, 9, 3, 17, 5, 22]
    config = SpecConfig(ThresholdScheduler(0.3), max_new_tokens=20, max_draft=4)
    reference = speculative_generate(target, prompt, config).tokens.tolist()
    compact = CompactCausalLM(target)
    assert speculative_generate(compact, prompt, config).tokens.tolist() == reference
    for drafter in (ModelDrafter(CompactCausalLM(draft_model)), ModelDrafter(CompactCausalLM(target))):
        for verifier in (target, compact):
            assert speculative_generate(verifier, prompt, config, drafter).tokens.tolist() == reference


def test_other_architectures_are_refused_and_auto_falls_back():
    markov = MarkovLM(torch.eye(VOCAB))
    with pytest.raises(ValueError, match="Llama-architecture.*'hf' runtime"):
        with_runtime(markov, "compact")
    assert with_runtime(markov, "auto") is markov
    assert resolve_runtime(tiny_llama(0, layers=1), "auto") == "compact"
    with pytest.raises(ValueError, match="runtime must be one of"):
        with_runtime(markov, "fast")


def test_length_dependent_rotary_padding_and_foreign_caches_are_refused():
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    import inspect

    # transformers 5 names the rotary settings `rope_parameters`, 4.x `rope_scaling`
    key = "rope_parameters" if "rope_parameters" in inspect.signature(LlamaConfig).parameters else "rope_scaling"
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=48, max_position_embeddings=16,
                         **{key: {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}})
    dynamic = LlamaForCausalLM(config).eval()
    with pytest.raises(ValueError, match="rope_type 'dynamic'"):
        CompactCausalLM(dynamic)
    assert resolve_runtime(dynamic, "auto") == "hf"
    compact = CompactCausalLM(tiny_llama(0, layers=1))
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="does not support padding"):
        compact(ids, attention_mask=torch.tensor([[0, 1, 1]]))
    assert compact(ids, attention_mask=torch.ones(1, 3)).logits.shape == (1, 3, VOCAB)
    with pytest.raises(TypeError, match="must be a CompactCache"):
        compact(ids, cache=DynamicCache())
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        CompactCache(1, 1, 2, 8, torch.float32, torch.device("cpu"), capacity=0)
