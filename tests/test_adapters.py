"""PEFT LoRA adapters against peft's own model (peft 0.21): merged and unmerged logits within
float32 rounding of peft's merged model on the tiny reference checkpoints; an unmerged batch of
rows with different adapters equals each adapter alone; decoding with adapters."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from dllm_decode.adapters import AdapterError, attach, merge, read_adapter, rows
from tests.models.conftest import FAMILIES, LENGTH, VOCAB

peft = pytest.importorskip("peft")

TOLERANCE = 1e-4
"""Max |d| of logits (float32, magnitudes ~10): the two paths sum the same products in another
order (merged W + sBA against the x A^T B^T delta)."""
TARGETS = {"llada": ["q_proj", "v_proj", "ff_out"], "dream": ["q_proj", "v_proj", "down_proj"]}


def save_adapter(base, family: str, directory, seed: int, **config):
    """A peft LoRA over a copy of `base` with random A and B, saved to `directory`; returns
    peft's merged model."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(base), LoraConfig(
        r=config.pop("r", 4), lora_alpha=config.pop("lora_alpha", 8), target_modules=TARGETS[family], **config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    model.save_pretrained(str(directory))
    return model.merge_and_unload().eval()


def ids(batch: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB - 2, (batch, LENGTH), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    return request.param, FAMILIES[request.param]()


@pytest.mark.parametrize("options", [{}, {"use_rslora": True, "rank_pattern": {"v_proj": 2},
                                          "alpha_pattern": {"q_proj": 3}}])
def test_merged_and_unmerged_match_peft(family, tmp_path, options):
    name, base = family
    reference = save_adapter(base, name, tmp_path, seed=3, **copy.deepcopy(options))
    x = ids()
    with torch.no_grad():
        expected = reference(x)
        merged = merge(copy.deepcopy(base), read_adapter(tmp_path))(x)
        unmerged_model = copy.deepcopy(base)
        attach(unmerged_model, [read_adapter(tmp_path, "a")])
        with rows(unmerged_model, [0, 0, 0]):
            unmerged = unmerged_model(x)
        plain = unmerged_model(x)                         # outside `rows`: the base model
    assert (merged - expected).abs().max() <= TOLERANCE
    assert (unmerged - expected).abs().max() <= TOLERANCE
    assert (plain - base(x)).abs().max() <= TOLERANCE
    assert (expected - base(x)).abs().max() > 100 * TOLERANCE     # the adapter does change logits


def test_merge_under_the_compact_runtime(tmp_path):
    from dllm_decode.models.compact import set_runtime

    base = FAMILIES["llada"]()
    reference = save_adapter(base, "llada", tmp_path, seed=4)
    model = set_runtime(copy.deepcopy(base), "compact")
    x = ids()
    with torch.no_grad():
        model(x)                                          # fuses the weights once
        merge(model, read_adapter(tmp_path))
        assert (model(x) - reference(x)).abs().max() <= TOLERANCE   # re-fused after the merge


def test_mixed_batch_equals_one_adapter_at_a_time(tmp_path):
    base = FAMILIES["dream"]()
    for seed in (5, 6):
        save_adapter(base, "dream", tmp_path / str(seed), seed=seed)
    model = copy.deepcopy(base)
    attach(model, [read_adapter(tmp_path / "5", "five"), read_adapter(tmp_path / "6", "six")])
    x = ids(batch=4)
    with torch.no_grad():
        with rows(model, [1, -1, 0, 1]):
            mixed = model(x)
        for row, adapter in enumerate([1, -1, 0, 1]):
            with rows(model, [adapter]):
                alone = model(x[row:row + 1])
            assert (mixed[row] - alone[0]).abs().max() <= TOLERANCE


def test_decoding_with_adapters_in_one_batch(tmp_path):
    from dllm_decode.config import DecodeConfig
    from dllm_decode.registry import component
    from dllm_decode.sampler import Decoding

    base = FAMILIES["llada"]()
    for seed in (7, 8):
        save_adapter(base, "llada", tmp_path / str(seed), seed=seed)
    model = copy.deepcopy(base)
    attach(model, [read_adapter(tmp_path / "7", "p"), read_adapter(tmp_path / "8", "q")])
    config = DecodeConfig(scheduler=component("scheduler", "low_confidence"), gen_length=8, block_length=4,
                          stop_at_eos=False)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    plan = [("p", 0), ("q", 1), (None, 0), ("q", 0)]

    def decode(requests):
        decoding = Decoding(model, config.cache)
        keys = [decoding.add([prompts[p]], config, adapter=a) for a, p in requests]
        while not decoding.finished:
            decoding.step()
        return [decoding.result(k).tokens[0].tolist() for k in keys]

    together = decode(plan)
    alone = [decode([request])[0] for request in plan]
    assert together == alone
    assert together[0] != together[2] or together[1] != together[3]   # adapters do decode differently
    with pytest.raises(ValueError, match="unknown adapter 'r'"):
        Decoding(model, config.cache).add([prompts[0]], config, adapter="r")


def test_bad_folders(tmp_path):
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        read_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    (tmp_path / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(AdapterError, match="never loaded"):
        read_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                              "use_dora": True}))
    with pytest.raises(AdapterError, match="use_dora"):
        read_adapter(tmp_path)
    base = FAMILIES["llada"]()
    save_adapter(base, "llada", tmp_path / "ok", seed=1)
    with pytest.raises(AdapterError, match="no such module"):
        merge(FAMILIES["dream"](), read_adapter(tmp_path / "ok"))
