"""A request that changes nothing in the server's decode record shares one record object, built
once, and the engine checks that record against the model once."""

from __future__ import annotations

import pytest

from tests.serve.conftest import default_config


def _settings(**fields):
    from dllm_decode.serve.protocol import Settings

    return Settings(model_id="embedded", config=default_config(), max_tokens=256, **fields)


def test_plain_requests_share_one_record_and_options_build_their_own(embedded):
    from dllm_decode.serve.protocol import parse_job

    settings, tok = _settings(), embedded.tokenizer
    job = lambda **body: parse_job("completion", {"prompt": "sort : bob al", **body}, settings, tok)
    first, second = job(), job(dllm={})
    assert first.config is second.config and first.config == settings.config
    assert job(max_tokens=8).config is job(max_tokens=8).config
    assert job(max_tokens=8).config.gen_length == 8 and job(max_tokens=8).config is not first.config
    seeded = job(seed=7)
    assert seeded.config is not job(seed=7).config and seeded.config.seed == 7
    changed = job(dllm={"block_length": 4})
    assert changed.config.block_length == 4 and changed.config is not first.config
    assert job(temperature=0.5).config.temperature == 0.5
    assert set(settings.records) == {(None, None), (None, 8)}


def test_a_refused_record_is_refused_every_time(embedded):
    from dllm_decode.serve.protocol import APIError, parse_job

    settings = _settings()
    for _ in range(2):
        with pytest.raises(APIError, match="exceeds this server's limit of 256"):
            parse_job("completion", {"prompt": "sort : bob", "max_tokens": 300}, settings, embedded.tokenizer)
    assert not settings.records


def test_the_engine_checks_a_record_once_and_a_refused_one_every_time(embedded, monkeypatch):
    from dllm_decode import engine as engine_module
    from dllm_decode.engine import Engine, Request
    from dllm_decode.registry import component

    calls = []
    check_cache = engine_module.check_cache
    monkeypatch.setattr(engine_module, "check_cache", lambda model, config: (calls.append(config),
                                                                             check_cache(model, config)))
    engine = Engine(embedded, max_batch_size=2)
    config = default_config()
    for i in range(3):
        engine.check(Request(id=f"r{i}", prompt=(5, 6), config=config))
    assert len(calls) == 1
    engine.check(Request(id="other", prompt=(5, 6), config=default_config()))    # an equal, new record
    assert len(calls) == 2
    with pytest.raises(ValueError, match="context"):                  # prompt checks still run each time
        engine.check(Request(id="long", prompt=(5,) * 5000, config=config))
    block = default_config(cache=component("cache", "block"))           # LLaDA has no block-causal attention
    for _ in range(2):
        with pytest.raises(ValueError):
            engine.check(Request(id="b", prompt=(5, 6), config=block))
    assert len(calls) == 4
