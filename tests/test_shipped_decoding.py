"""`DecodeConfig.for_model`: the decoding each family's checkpoint ships with, and the CLI using
it when no scheduler is named."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from dllm_decode.config import DecodeConfig
from dllm_decode.models.loading import load_model
from dllm_decode.schedulers import (LowConfidenceScheduler, RandomScheduler, ThresholdScheduler,
                                    UniformNoiseScheduler)
from dllm_decode.testing import tiny_block_diffusion, tiny_diffusion_gemma, tiny_llada


def test_each_family_gets_its_reference_generate_default():
    llada = DecodeConfig.for_model(tiny_llada(), gen_length=64)
    assert llada.scheduler == LowConfidenceScheduler() and llada.block_length == 64
    assert DecodeConfig.for_model(tiny_llada(), gen_length=256).block_length == 128
    for family, threshold in (("fast_dllm", 0.9), ("sdar", 0.85), ("llada2", 0.95)):
        model = tiny_block_diffusion(family)
        config = DecodeConfig.for_model(model, gen_length=16)
        assert config.scheduler == ThresholdScheduler(threshold), family
        assert config.block_length == model.block_size


def test_dream_default_is_random_order_in_one_block(tmp_path):
    from tests.models.conftest import make_dream

    model = make_dream()
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    config = DecodeConfig.for_model(loaded, gen_length=16)
    assert config.scheduler == RandomScheduler() and config.block_length == 16


def test_diffusion_gemma_reads_its_generation_config(tmp_path):
    model = tiny_diffusion_gemma()
    model.generation_defaults = {"max_denoising_steps": 7, "t_min": 0.3, "eos_token_id": 1,
                                 "sampler_config": {"entropy_bound": 0.2}}
    config = DecodeConfig.for_model(model, gen_length=20)
    assert config.scheduler == UniformNoiseScheduler(entropy_bound=0.2, steps=7, t_min=0.3)
    assert (config.gen_length, config.block_length, config.stop_at_eos) == (24, 8, True)
    model.generation_defaults = {}
    assert DecodeConfig.for_model(model, gen_length=8).scheduler == UniformNoiseScheduler()
    assert not DecodeConfig.for_model(model, gen_length=8).stop_at_eos


def test_embedded_models_ship_the_cli_default():
    for name in ("embedded", "embedded-bd"):
        model = load_model(name)
        config = DecodeConfig.for_model(model, gen_length=32)
        assert config.scheduler == ThresholdScheduler()
        assert config.block_length == (getattr(model, "block_size", None) or 32)


def test_unknown_family_is_one_line():
    class Other:
        config = None
    with pytest.raises(ValueError, match="no shipped decoding is known"):
        DecodeConfig.for_model(Other(), gen_length=8)


def test_cli_uses_the_shipped_scheduler_only_when_none_is_named(tmp_path):
    from tests.models.conftest import make_llada
    from dllm_decode.testing import tiny_tokenizer

    model = make_llada()
    model.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(str(tmp_path))
    runner = CliRunner()
    base = ["--model", str(tmp_path), "--gen-length", "8", "--json", "--prompt", "a b"]
    shipped = json.loads(runner.invoke(main, base).output)
    named = json.loads(runner.invoke(main, [*base, "--scheduler", "threshold"]).output)
    assert shipped["config"]["scheduler"]["name"] == "low_confidence"
    assert named["config"]["scheduler"]["name"] == "threshold"
