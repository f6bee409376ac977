"""LoRA adapters in serve (unmerged, `MODEL:NAME`, mixed in one batch) and in decode (merged,
`--adapter DIR`), against `generate` on a model with the adapter merged."""

from __future__ import annotations

import concurrent.futures
import copy
import json
import urllib.request

import pytest
from click.testing import CliRunner

from tests.serve.conftest import default_config, post
from tests.test_adapters import save_adapter

pytest.importorskip("peft")

PROMPTS = ["sort: 3 1 2", "sort: 9 4 7 1", "sort: 5 2"]


@pytest.fixture(scope="module")
def adapters(embedded, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    for name, seed in (("one", 1), ("two", 2)):
        save_adapter(embedded, "llada", root / name, seed)   # the embedded model is a LLaDA
    return root


def expected(embedded, folder, prompt: str, config) -> str:
    from dllm_decode.adapters import merge, read_adapter
    from dllm_decode.sampler import generate

    model = embedded if folder is None else merge(copy.deepcopy(embedded), read_adapter(folder))
    return generate(model, [prompt], config).text[0].strip()


def test_requests_choose_unmerged_adapters_and_share_a_batch(embedded, adapters):
    from dllm_decode.adapters import attach, read_adapter
    from dllm_decode.engine import Engine
    from dllm_decode.serve.app import Limits, ServerState, background
    from dllm_decode.serve.protocol import Settings
    from dllm_decode.serve.worker import EngineWorker

    model = copy.deepcopy(embedded)
    attach(model, [read_adapter(adapters / "one", "one"), read_adapter(adapters / "two", "two")])
    config = default_config(gen_length=16, block_length=8)
    settings = Settings(model_id="embedded", config=config, max_tokens=64, adapters=("one", "two"))
    state = ServerState(EngineWorker(Engine(model, max_batch_size=8), threads=1), settings, Limits())
    plan = [(p, a) for p in PROMPTS for a in (None, "one", "two")]
    with background(state) as url:
        def ask(item):
            prompt, adapter = item
            return post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 16,
                                                 "model": "embedded" + (f":{adapter}" if adapter else "")})
        with concurrent.futures.ThreadPoolExecutor(len(plan)) as pool:
            replies = list(pool.map(ask, plan))
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
            listed = [m["id"] for m in json.loads(response.read())["data"]]
        bad_status, bad = post(url, "/v1/completions", {"prompt": "x", "model": "embedded:three"})
    assert listed == ["embedded", "embedded:one", "embedded:two"]
    assert bad_status == 400 and "unknown preset" in bad["error"]["message"]
    texts = {}
    for (prompt, adapter), (status, reply) in zip(plan, replies):
        assert status == 200, reply
        assert reply["dllm"].get("adapter") == adapter
        folder = None if adapter is None else adapters / adapter
        assert reply["choices"][0]["text"] == expected(embedded, folder, prompt, config), (prompt, adapter)
        texts[prompt, adapter] = reply["choices"][0]["text"]
    assert len({texts[p, a] for p in PROMPTS for a in (None, "one", "two")}) > len(PROMPTS)   # adapters matter


def test_decode_merges_an_adapter(embedded, adapters):
    from dllm_decode.cli import main
    from dllm_decode.config import DecodeConfig

    result = CliRunner().invoke(main, ["--model", "embedded", "--adapter", str(adapters / "one"),
                                       "--prompt", PROMPTS[1], "--gen-length", "16", "--block-length", "8",
                                       "--json"])
    assert result.exit_code == 0, result.output
    reply = json.loads(result.output.strip().splitlines()[-1])
    config = DecodeConfig.from_dict(reply["config"])
    assert reply["text"] == expected(embedded, adapters / "one", PROMPTS[1], config)
    assert reply["text"] != expected(embedded, None, PROMPTS[1], config)
    named = CliRunner().invoke(main, ["--model", "embedded", "--adapter", f"one={adapters / 'one'}",
                                      "--prompt", PROMPTS[0]])
    assert named.exit_code == 2 and "serve only" in named.output
    missing = CliRunner().invoke(main, ["--model", "embedded", "--adapter", str(adapters / "none"),
                                        "--prompt", PROMPTS[0]])
    assert missing.exit_code == 2 and "adapter_config.json" in missing.output


def test_load_model_merges_and_eval_loads_with_adapters(embedded, adapters):
    from dllm_decode.adapters import merge, read_adapter
    from dllm_decode.eval.harness.runner import decoder_for
    from dllm_decode.modelspec import ModelSpec, load_diffusion

    loaded = load_diffusion(ModelSpec.parse("embedded"), adapter=[adapters / "one"])
    reference = merge(copy.deepcopy(embedded), read_adapter(adapters / "one"))
    for (name, mine), (_, theirs) in zip(loaded.named_parameters(), reference.named_parameters()):
        assert (mine - theirs).abs().max() <= 1e-6, name
    with pytest.raises(ValueError, match="diffusion LMs"):
        decoder_for(ModelSpec.parse("ar:ar_target"), adapter=[str(adapters / "one")])


def test_an_adapter_and_a_preset_may_not_share_a_name():
    from dllm_decode.serve.protocol import Settings

    with pytest.raises(ValueError, match="names both an adapter and a preset"):
        Settings(model_id="m", config=default_config(), adapters=("sort",), presets={"sort": default_config()})
