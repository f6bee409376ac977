"""The cross-request prefix cache: the radix store (LRU under a byte budget), and the engine's
exact reuse on the shipped block-diffusion model in float32 (tokens equal with and without it:
partly cached prompts, batches mixing hits and misses, eviction mid-run, sampled decoding),
isolation (a shared part of a block, another adapter), the approximate opt-in of bidirectional
models, the options and the server's figures."""

from __future__ import annotations

import json

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Engine, Request
from dllm_decode.models.loading import load_model
from dllm_decode.prefix_options import MAX_PREFIX_BYTES, PrefixOptions
from dllm_decode.prefix_store import PrefixStore
from dllm_decode.registry import component

GRID = 8          # embedded-bd's block_size
KV_BLOCK = 4 * 2 * 6 * GRID * 32 * 4     # layers x (K, V) x heads x columns x head_dim x float32 bytes


@pytest.fixture(scope="module")
def bd():
    model = load_model("embedded-bd", dtype=torch.float32)
    assert model.block_size == GRID
    return model


def config(**fields):
    return DecodeConfig(**{"scheduler": component("scheduler", "threshold"), "cache": component("cache", "block"),
                           "gen_length": 16, "block_length": 8, **fields})


def serve_all(model, requests, budget, max_batch=2, watch=None):
    """Every request through one engine (max_batch rows; later ones join running batches);
    returns {id: Output} and the engine."""
    engine = Engine(model, max_batch_size=max_batch, prefix_cache_bytes=budget)
    for request in requests:
        engine.add(request)
    outputs = {}
    while engine.has_work:
        for update in engine.step():
            if update.output is not None:
                outputs[update.request_id] = update.output
        if watch is not None:
            watch(engine)
    return outputs, engine


def prompt(n, seed):
    return tuple(torch.randint(5, 120, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


SYSTEM = prompt(37, 0)         # 4 whole blocks and 5 tokens


def workload():
    """Shared whole blocks, a prompt sharing only part of the system prompt, one sharing part of
    a block, unrelated ones, a second turn carrying the first, and a sampled request."""
    sampled = config(temperature=0.7, seed=3)
    return [Request("a", SYSTEM + prompt(6, 1), config()),
            Request("b", SYSTEM + prompt(9, 2), config()),
            Request("c", SYSTEM[:20] + prompt(15, 3), config()),       # 2 blocks shared, then differs
            Request("d", prompt(30, 4), config()),
            Request("e", SYSTEM + prompt(6, 1) + prompt(12, 5), config()),
            Request("f", SYSTEM + prompt(3, 6), sampled),
            Request("g", SYSTEM + prompt(3, 6), sampled),
            Request("h", prompt(17, 7), config()),
            Request("i", SYSTEM + prompt(6, 1), config(block_length=4))]      # sub-blocks of the grid


# -- the store ------------------------------------------------------------------------------------

def value(nbytes):
    return torch.zeros(nbytes, dtype=torch.uint8)


def test_store_matches_the_longest_stored_prefix_by_whole_chunks():
    store = PrefixStore(1000)
    assert store.insert("ns", [(1, 2), (3, 4), (5, 6)], lambda i: value(10) + i) == 3
    found = store.match("ns", [(1, 2), (3, 4), (9, 9), (5, 6)])
    assert [int(v[0]) for v in found] == [0, 1]
    assert store.match("ns", [(1, 3)]) == [] and store.match("other", [(1, 2)]) == []
    made = []
    assert store.insert("ns", [(1, 2), (3, 4), (7, 8)], lambda i: made.append(i) or value(10)) == 1
    assert made == [2] and store.stats().entries == 4 and store.stats().resident_bytes == 40


def test_store_evicts_least_recently_used_leaves_under_its_budget():
    store = PrefixStore(40)
    store.insert("ns", [(1,), (2,)], lambda i: value(10))        # path 1 -> 2
    store.insert("ns", [(1,), (3,)], lambda i: value(10))        # path 1 -> 3
    store.match("ns", [(1,), (2,)])                              # 1 -> 3 is now the oldest leaf
    store.insert("ns", [(4,), (5,)], lambda i: value(10))        # 50 bytes: one leaf goes
    stats = store.stats()
    assert stats.resident_bytes == 40 and stats.evicted == 1
    assert len(store.match("ns", [(1,), (3,)])) == 1             # the old leaf went first
    assert len(store.match("ns", [(4,), (5,)])) == 2             # the new key stayed whole
    assert all(node.parent is None or node.chunk in node.parent.children for node in store.lru.values())
    big = PrefixStore(15)
    assert big.insert("ns", [(1,), (2,)], lambda i: value(10 if i == 0 else 20)) == 1   # 20 > budget
    with pytest.raises(ValueError, match="positive number of bytes"):
        PrefixStore(0)


# -- exact reuse in the engine --------------------------------------------------------------------

def test_tokens_equal_with_and_without_the_prefix_cache(bd):
    """Batches of 2 rows, requests joining running batches: hits and misses mix in a batch."""
    without, _ = serve_all(bd, workload(), 0)
    with_cache, engine = serve_all(bd, workload(), 1 << 24)
    assert {k: v.tokens for k, v in with_cache.items()} == {k: v.tokens for k, v in without.items()}
    assert all(o.finish_reason in ("stop", "length") for o in with_cache.values())
    cached = {k: v.cached_tokens for k, v in with_cache.items()}
    assert cached["a"] == cached["b"] == cached["d"] == 0            # the first batch: nothing stored
    assert cached["c"] == 16                                          # 2 whole blocks of the 20 shared
    assert cached["e"] == 40                                          # a's 43 tokens: 5 whole blocks
    assert cached["f"] == 32 and cached["h"] == 0
    assert cached["g"] == 40                  # f's whole prompt (5 blocks): it starts at its answer
    stats = engine.prefix.stats()
    assert cached["i"] == 40                  # a's prompt, as for e
    assert stats.hits == 5 and stats.misses == 4 and stats.reused_tokens == sum(cached.values())
    assert 0 < stats.resident_bytes == stats.entries * KV_BLOCK
    assert without["f"].tokens == without["g"].tokens               # seeded sampling repeats


def test_eviction_mid_run_keeps_tokens_and_the_budget(bd):
    budget = 5 * KV_BLOCK
    seen = []
    without, _ = serve_all(bd, workload(), 0)
    with_cache, engine = serve_all(bd, workload(), budget, watch=lambda e: seen.append(e.prefix.stats()))
    assert {k: v.tokens for k, v in with_cache.items()} == {k: v.tokens for k, v in without.items()}
    assert max(s.resident_bytes for s in seen) <= budget
    assert seen[-1].evicted > 0 and seen[-1].hits > 0


def test_a_shared_part_of_a_block_is_not_reused(bd):
    """Prompts equal on 12 tokens (1.5 blocks): the second reuses the first block only, and the
    store holds no block of the first prompt past what the two share."""
    first, second = prompt(12, 8) + prompt(9, 9), prompt(12, 8) + prompt(9, 10)
    outputs, engine = serve_all(bd, [Request("x", first, config())], 1 << 24, max_batch=1)
    stored = engine.prefix.stats().entries
    assert stored == len(first) // GRID
    engine.add(Request("y", second, config()))
    while engine.has_work:
        for update in engine.step():
            if update.output is not None:
                outputs[update.request_id] = update.output
    alone, _ = serve_all(bd, [Request("y", second, config())], 0, max_batch=1)
    assert outputs["y"].cached_tokens == GRID and outputs["y"].tokens == alone["y"].tokens


def lora_folder(folder, shapes, rank=2):
    """A PEFT LoRA adapter folder of random rank-`rank` weights for `shapes` (module path ->
    (out, in) features), seeded."""
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}))
    generator = torch.Generator().manual_seed(0)
    save_file({f"base_model.model.{path}.lora_{m}.weight":
               torch.randn((rank, n_in) if m == "A" else (n_out, rank), generator=generator) * 0.3
               for path, (n_out, n_in) in shapes.items() for m in "AB"}, str(folder / "adapter_model.safetensors"))
    return folder


def test_other_adapters_never_share(bd, tmp_path):
    from dllm_decode.adapters import attach, read_adapter

    model = load_model("embedded-bd", dtype=torch.float32)
    folder = lora_folder(tmp_path / "kv", {f"model.layers.{i}.self_attn.{p}": (192, 192)
                                           for i in range(4) for p in ("k_proj", "v_proj")})
    attach(model, [read_adapter(folder, "kv")])
    base = [Request("a", SYSTEM + prompt(6, 1), config())]
    tuned = [Request("t", SYSTEM + prompt(6, 2), config(), adapter="kv"),
             Request("u", SYSTEM + prompt(6, 3), config(), adapter="kv")]
    outputs, engine = serve_all(model, base + tuned, 1 << 24, max_batch=1)
    assert outputs["t"].cached_tokens == 0 and outputs["u"].cached_tokens == 32   # its own adapter's
    alone, _ = serve_all(model, tuned, 0, max_batch=1)
    assert outputs["u"].tokens == alone["u"].tokens


def test_no_reuse_where_it_would_not_be_exact():
    """A bidirectional model (the shipped LLaDA-format `embedded`) declares no exact reuse: the
    engine serves it as before, counting nothing."""
    model = load_model("embedded", dtype=torch.float32)
    requests = [Request(k, SYSTEM[:20] + prompt(4, i), config(cache=component("cache", "prefix")))
                for i, k in enumerate("ab")]
    outputs, engine = serve_all(model, requests, 1 << 24, max_batch=1)
    plain, _ = serve_all(model, requests, 0, max_batch=1)
    assert {k: v.tokens for k, v in outputs.items()} == {k: v.tokens for k, v in plain.items()}
    stats = engine.prefix.stats()
    assert stats.hits == stats.misses == stats.entries == 0


def test_approximate_reuse_is_an_opt_in_of_the_prefix_cache():
    """Opted in, the `prefix` cache on the bidirectional `embedded` model takes stored prompt
    chunks (tokens may change: measured, not asserted); `none` never does."""
    model = load_model("embedded", dtype=torch.float32)
    shared = tuple(model.tokenizer("sort : mia ella hank", add_special_tokens=False)["input_ids"])
    requests = [Request(k, shared + (i + 5,) * (i + 1), config(cache=component("cache", "prefix")))
                for i, k in enumerate("abc")]
    requests.append(Request("d", shared, config(cache=component("cache", "none"))))
    engine = Engine(model, max_batch_size=1, prefix_cache_bytes=1 << 24, prefix_cache_approximate=2)
    for request in requests:
        engine.add(request)
    outputs = {}
    while engine.has_work:
        outputs.update({u.request_id: u.output for u in engine.step() if u.output is not None})
    chunks = len(shared) // 2 * 2
    assert [outputs[k].cached_tokens for k in "abcd"] == [0, chunks, chunks, 0]
    assert all(o.finish_reason in ("stop", "length") for o in outputs.values())
    stats = engine.prefix.stats()
    assert stats.hits == 2 and stats.misses == 1          # `none` is neither
    with pytest.raises(ValueError, match="needs a prefix cache"):
        Engine(model, prefix_cache_approximate=2)


# -- options, server ------------------------------------------------------------------------------

@pytest.mark.parametrize("options, words", [
    ({"budget_bytes": -1}, ">= 0"), ({"budget_bytes": MAX_PREFIX_BYTES + 1}, f"<= {MAX_PREFIX_BYTES}"),
    ({"budget_bytes": True}, "budget_bytes"), ({"budget_bytes": 1.5}, "budget_bytes"),
    ({"budget_bytes": 1, "capture": "static"}, "capture 'static'"),
    ({"budget_bytes": 1, "causal_lm": True}, "causal LM"),
    ({"budget_bytes": 1, "approximate": -1}, ">= 0"), ({"approximate": 4}, "needs a prefix cache")])
def test_options_are_checked_as_a_whole(options, words):
    with pytest.raises((ValueError, TypeError), match=words):
        PrefixOptions(**options)
    assert PrefixOptions(0, "static").sharing() is None


def test_engine_refuses_a_prefix_cache_under_capture(bd):
    with pytest.raises(ValueError, match="eager step"):
        Engine(bd, prefix_cache_bytes=1 << 20, capture="static")


def test_serve_option_is_bounded():
    from click.testing import CliRunner

    from dllm_decode.cli import main

    for value in ("-1", str(MAX_PREFIX_BYTES + 1), "1.5"):
        result = CliRunner().invoke(main, ["serve", "--model", "embedded-bd", "--prefix-cache-bytes", value])
        assert result.exit_code == 2 and "--prefix-cache-bytes" in result.output, result.output
        assert "Traceback" not in result.output
    result = CliRunner().invoke(main, ["serve", "--model", "embedded", "--prefix-cache-approximate", "2"])
    assert result.exit_code == 2 and "needs a prefix cache" in result.output, result.output


def test_server_reports_cached_tokens_and_metrics(bd):
    pytest.importorskip("fastapi")
    from dllm_decode.serve.app import Limits, ServerState, background
    from dllm_decode.serve.protocol import Settings
    from dllm_decode.serve.worker import EngineWorker
    from tests.serve.conftest import post
    from tests.serve.test_operations import get

    engine = Engine(bd, max_batch_size=2, prefix_cache_bytes=1 << 22)
    state = ServerState(EngineWorker(engine, threads=1), Settings(model_id="embedded-bd", config=config(),
                                                                  max_tokens=64), Limits())
    with background(state) as url:
        bodies = [{"model": "embedded-bd", "prompt": list(SYSTEM + prompt(4, i))} for i in range(2)]
        first, second = (post(url, "/v1/completions", body)[1] for body in bodies)
        status, metrics = get(url, "/metrics")
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("dllm_prefix"))
    assert values["dllm_prefix_cache_hits_total"] == "1" and values["dllm_prefix_cache_misses_total"] == "1"
    assert values["dllm_prefix_cache_reused_tokens_total"] == "32"
    assert int(values["dllm_prefix_cache_resident_bytes"]) == 6 * KV_BLOCK     # 4 shared + 1 each
    assert values["dllm_prefix_cache_budget_bytes"] == str(1 << 22)
