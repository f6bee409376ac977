"""The cross-request prefix cache on DiffusionGemma's causal encoder (`dllm_decode.encoder_reuse`):
an encoder cache built from stored chunks equals the one-pass encode to float rounding (sliding
layers past their window, a wholly stored prompt); the engine's tokens are identical with and
without the cache on the shipped `embedded-noise` and on a random tiny model (requests joining
running batches, eviction under a small budget); counters, isolation (adapters, the store's
dtype, padded rows), low-precision codes stored as held, and the refusals that stay."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.encoder_reuse import RequestPrefix
from dllm_decode.engine import Engine, Request
from dllm_decode.models.loading import load_model
from dllm_decode.prefix_reuse import PrefixSharing
from dllm_decode.testing import assert_logits_close, tiny_diffusion_gemma

CHUNK = 8                         # both models' canvas length


@pytest.fixture(scope="module")
def noise():
    return load_model("embedded-noise", dtype=torch.float32)


@pytest.fixture(scope="module")
def tiny():
    return tiny_diffusion_gemma(seed=2, steps=4)


def prompt(n, seed, vocab=120):
    return tuple(torch.randint(5, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


def member(key, adapter=-1):
    return SimpleNamespace(key=key, adapter=adapter)


def encode(sharing, model, request, ids, mask=None):
    """A request's prompt encoded through the store."""
    return RequestPrefix(sharing, CHUNK).encode(model, request, ids, mask, None)


def chunk_bytes(model, quantized=False):
    """One stored chunk: every layer's K and V of CHUNK columns (float32, or int8 codes and a
    float32 scale per head and column)."""
    c = model.config
    return sum(2 * h * CHUNK * (d + 4 if quantized else 4 * d) for h, d in zip(c.layer_kv_heads, c.layer_head_dims))


# -- the encoder cache ------------------------------------------------------------------------------

@pytest.mark.parametrize("whole", [False, True])
def test_a_seeded_encoder_cache_equals_the_one_pass_encode(tiny, whole):
    """29 shared tokens (3 whole chunks, past the sliding window of 8): the second prompt encodes
    only its tail after the stored chunks (or nothing, when all of it is stored); its K/V and
    the decoder's logits agree with encoding it at once."""
    sharing = PrefixSharing(1 << 24)
    system = prompt(29, 0)
    first = torch.tensor([system + prompt(7, 1)])
    second = first[:, :32] if whole else torch.tensor([system + prompt(5, 2)])
    encode(sharing, tiny, member("a"), first)
    cached = encode(sharing, tiny, member("b"), second)
    alone = tiny.encode(second)
    assert sharing.take("b") == (32 if whole else 24)
    assert (cached.seen, cached.padded, cached.mask.shape) == (alone.seen, alone.padded, alone.mask.shape)
    for got, want in zip([*cached.keys, *cached.values], [*alone.keys, *alone.values]):
        assert got.shape == want.shape
        assert_logits_close(got, want)
    canvas = torch.tensor([prompt(CHUNK, 9)])
    assert_logits_close(tiny.denoise(canvas, cached), tiny.denoise(canvas, alone))


def test_namespaces_and_padding_keep_values_apart(tiny):
    """Another adapter or another store dtype finds nothing; a padded request (prompts of two
    lengths) neither reads nor stores; equal-length rows reuse their common stored prefix."""
    from dllm_decode.quant.kv import set_kv_cache_dtype

    sharing = PrefixSharing(1 << 24)
    system = prompt(16, 3)
    ids = torch.tensor([system + prompt(4, 4)])
    encode(sharing, tiny, member("a"), ids)
    stored = sharing.store.stats().entries
    encode(sharing, tiny, member("t", adapter=0), ids)
    assert sharing.take("t") == 0
    try:
        set_kv_cache_dtype(tiny, "int8")
        encode(sharing, tiny, member("q"), ids)
        assert sharing.take("q") == 0
    finally:
        set_kv_cache_dtype(tiny, "auto")
    entries = sharing.store.stats().entries
    padded = torch.tensor([system + prompt(4, 5), (0,) * 3 + system + (7,)])
    mask = padded != 0
    mask[0] = True
    encode(sharing, tiny, member("p"), padded, mask)
    assert sharing.take("p") == 0 and sharing.store.stats().entries == entries
    rows = torch.tensor([system + prompt(4, 6), system[:8] + prompt(12, 7)])
    encode(sharing, tiny, member("r"), rows)
    assert sharing.take("r") == CHUNK                          # the second row shares one chunk
    assert entries == 3 * stored and sharing.stats().misses == 4 and sharing.stats().hits == 1


def test_a_low_precision_cache_stores_its_codes_as_held(tiny):
    """int8: stored values are the cache's codes and scales ((D + 4) / 4D of float32's bytes);
    a wholly stored prompt gets back exactly the codes encoding it afresh gives."""
    from dllm_decode.quant.kv import set_kv_cache_dtype

    sharing = PrefixSharing(1 << 24)
    ids = torch.tensor([prompt(24, 8)])
    try:
        set_kv_cache_dtype(tiny, "int8")
        encode(sharing, tiny, member("a"), ids)
        cached = encode(sharing, tiny, member("b"), ids)
        alone = tiny.encode(ids)
    finally:
        set_kv_cache_dtype(tiny, "auto")
    assert sharing.take("b") == 24 and cached.store is alone.store is not None
    for got, want in zip([*cached.keys, *cached.values], [*alone.keys, *alone.values]):
        assert got.codes.dtype == torch.int8
        assert torch.equal(got.codes, want.codes) and torch.equal(got.scales, want.scales)
    assert sharing.store.stats().resident_bytes == 3 * chunk_bytes(tiny, quantized=True) < 3 * chunk_bytes(tiny)


# -- through the engine ---------------------------------------------------------------------------

def serve_all(model, requests, budget, max_batch=2, watch=None, **engine_options):
    engine = Engine(model, max_batch_size=max_batch, prefix_cache_bytes=budget, **engine_options)
    for request in requests:
        engine.add(request)
    outputs = {}
    while engine.has_work:
        outputs.update({u.request_id: u.output for u in engine.step() if u.output is not None})
        if watch is not None:
            watch(engine)
    return outputs, engine


def workload(model, vocab=120):
    """A shared system prompt (4 chunks and 5 tokens), a prompt sharing part of it, unrelated
    ones, a second turn carrying a first, and two seeded requests with one prompt."""
    config = DecodeConfig.for_model(model, 16)
    seeded = dataclasses.replace(config, seed=3)
    system = prompt(37, 0, vocab)
    return [Request("a", system + prompt(6, 1, vocab), config),
            Request("b", system + prompt(9, 2, vocab), config),
            Request("c", system[:20] + prompt(15, 3, vocab), config),
            Request("d", prompt(30, 4, vocab), config),
            Request("e", system + prompt(6, 1, vocab) + prompt(12, 5, vocab), config),
            Request("f", system + prompt(3, 6, vocab), seeded),
            Request("g", system + prompt(3, 6, vocab), seeded)]


@pytest.mark.parametrize("name", ["noise", "tiny"])
def test_tokens_equal_with_and_without_the_prefix_cache(name, request):
    """Two rows at a time, later requests joining running batches: identical tokens, the reused
    prompt tokens per response, the counters and the stored bytes."""
    model = request.getfixturevalue(name)
    vocab = 120 if name == "tiny" else model.vocab_size
    without, _ = serve_all(model, workload(model, vocab), 0)
    with_cache, engine = serve_all(model, workload(model, vocab), 1 << 24)
    assert {k: v.tokens for k, v in with_cache.items()} == {k: v.tokens for k, v in without.items()}
    cached = {k: v.cached_tokens for k, v in with_cache.items()}
    # b joins with a, and a's prompt is stored as it is encoded: b, in the same step, finds it
    assert cached == {"a": 0, "b": 32, "c": 16, "d": 0, "e": 40, "f": 32, "g": 40}
    stats = engine.prefix.stats()
    assert stats.hits == 5 and stats.misses == 2 and stats.reused_tokens == sum(cached.values())
    assert 0 < stats.resident_bytes == stats.entries * chunk_bytes(model) <= stats.budget_bytes
    assert without["f"].tokens == without["g"].tokens


def test_eviction_keeps_tokens_and_the_budget(tiny):
    budget = 6 * chunk_bytes(tiny)
    seen = []
    without, _ = serve_all(tiny, workload(tiny), 0)
    with_cache, _ = serve_all(tiny, workload(tiny), budget, watch=lambda e: seen.append(e.prefix.stats()))
    assert {k: v.tokens for k, v in with_cache.items()} == {k: v.tokens for k, v in without.items()}
    assert max(s.resident_bytes for s in seen) <= budget
    assert seen[-1].evicted > 0 and seen[-1].hits > 0


def test_other_adapters_never_share(tmp_path):
    from dllm_decode.adapters import attach, read_adapter
    from tests.test_prefix_cache import lora_folder

    model = tiny_diffusion_gemma(seed=2, steps=4)
    folder = lora_folder(tmp_path / "kv", {f"model.decoder.layers.{i}.self_attn.k_proj": (32, 32) for i in range(2)})
    attach(model, [read_adapter(folder, "kv")])
    config = DecodeConfig.for_model(model, 8)
    system = prompt(24, 0)
    base = [Request("a", system + prompt(4, 1), config)]
    tuned = [Request("t", system + prompt(4, 2), config, adapter="kv"),
             Request("u", system + prompt(4, 3), config, adapter="kv")]
    outputs, _ = serve_all(model, base + tuned, 1 << 24, max_batch=1)
    assert outputs["t"].cached_tokens == 0 and outputs["u"].cached_tokens == 24
    alone, _ = serve_all(model, tuned, 0, max_batch=1)
    assert outputs["u"].tokens == alone["u"].tokens


def test_refusals_that_stay(noise):
    """A capture mode still refuses the prefix cache; a model keeping no K/V still does."""
    from dllm_decode.prefix_options import PrefixOptions

    with pytest.raises(ValueError, match="eager step"):
        Engine(noise, prefix_cache_bytes=1 << 20, capture="static")
    with pytest.raises(ValueError, match="supports_kv"):
        PrefixOptions(1 << 20, keeps_kv=False)
    assert Engine(noise, prefix_cache_bytes=1 << 20).prefix is not None


def test_server_reports_cached_tokens_and_metrics(noise):
    pytest.importorskip("fastapi")
    from dllm_decode.serve.app import Limits, ServerState, background
    from dllm_decode.serve.protocol import Settings
    from dllm_decode.serve.worker import EngineWorker
    from tests.serve.conftest import post
    from tests.serve.test_operations import get

    engine = Engine(noise, max_batch_size=2, prefix_cache_bytes=1 << 22)
    settings = Settings(model_id="embedded-noise", config=DecodeConfig.for_model(noise, 8), max_tokens=64)
    system = prompt(37, 0, noise.vocab_size)
    with background(ServerState(EngineWorker(engine, threads=1), settings, Limits())) as url:
        bodies = [{"model": "embedded-noise", "prompt": list(system + prompt(4, i, noise.vocab_size))}
                  for i in range(2)]
        first, second = (post(url, "/v1/completions", body)[1] for body in bodies)
        _, metrics = get(url, "/metrics")
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (first, second)] == [0, 32]
    series = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("dllm_prefix_cache_"))
    want = {"hits_total": 1, "misses_total": 1, "reused_tokens_total": 32,
            "resident_bytes": 6 * chunk_bytes(noise)}                    # 4 shared chunks + 1 each
    assert {k: int(series["dllm_prefix_cache_" + k]) for k in want} == want


def test_a_second_turn_reuses_the_first_turns_answer(tiny):
    """Committed canvases are encoded (and stored) before each next canvas: a chat's second turn,
    carrying the first turn's prompt and answer, reuses both up to the last whole chunk encoded."""
    config = DecodeConfig.for_model(tiny, 32)
    first = prompt(43, 11)
    outputs, engine = serve_all(tiny, [Request("1", first, config)], 1 << 24, max_batch=1)
    answer = tuple(outputs["1"].tokens)           # up to its end of text, in its last canvas
    second = Request("2", first + answer + prompt(5, 12), config)
    engine.add(second)
    while engine.has_work:
        outputs.update({u.request_id: u.output for u in engine.step() if u.output is not None})
    encoded = len(first) + CHUNK * (-(-len(answer) // CHUNK) - 1)    # every canvas before the last
    assert outputs["2"].cached_tokens == encoded // CHUNK * CHUNK > len(first) // CHUNK * CHUNK
    alone, _ = serve_all(tiny, [second], 0, max_batch=1)
    assert outputs["2"].tokens == alone["2"].tokens
