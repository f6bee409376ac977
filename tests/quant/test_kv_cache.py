"""The low-precision KV cache (`kv_cache_dtype` fp8 / int8): codes within their rounding bound of
float K/V, exact stored bytes, decodes that agree with float K/V, the same store on the eager,
captured and cached paths, and one-line errors for a bad value."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode.caches import CACHES
from dllm_decode.capture import GraphCache
from dllm_decode.config import DecodeConfig
from dllm_decode.models import load_model
from dllm_decode.models.layers import FLOAT_STORE, KVCache, StaticKVCache
from dllm_decode.quant.kv import (KV_CACHE_DTYPES, KVCacheDtypeError, KVQuantStore, kv_cache_dtype,
                                  kv_store_of, set_kv_cache_dtype)
from dllm_decode.sampler import generate
from dllm_decode.schedulers import ThresholdScheduler
from dllm_decode.testing import tiny_block_diffusion, tiny_llada

STORES = ("fp8", "int8")


def bound(x: torch.Tensor, name: str) -> torch.Tensor:
    """The largest error one code may carry: half an int8 step of absmax / 127; for e4m3 half an
    ulp (2^-4 relative with 3 mantissa bits), or half the smallest subnormal step (2^-10 of the
    scale) below the normal range."""
    amax = x.abs().amax(-1, keepdim=True)
    if name == "int8":
        return amax / 127 / 2
    return torch.maximum(x.abs() * 2.0 ** -4, amax / 448 * 2.0 ** -10)


@pytest.mark.parametrize("name", STORES)
def test_dequantized_kv_is_within_half_a_code_of_float(name):
    x = torch.randn(2, 3, 40, 32, generator=torch.Generator().manual_seed(0)) * 3
    x[0, 0, 0] = 0                                      # an all-zero vector stays zero
    store = KVQuantStore(name)
    back = store.read(store.put(x))
    assert back.dtype == x.dtype and back.shape == x.shape
    assert torch.all((back - x).abs() <= bound(x, name) * (1 + 1e-6))
    assert torch.equal(back[0, 0, 0], torch.zeros(32))
    rel = ((back - x).norm() / x.norm()).item()
    assert rel < (0.01 if name == "int8" else 0.05), rel


@pytest.mark.parametrize("name", STORES)
def test_the_cache_contract_on_codes_matches_float_kv(name):
    """Store, write in place, select rows, pad and trim: each read back equals the float
    cache's tensors within the rounding bound."""
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(3, 2, 10, 8, generator=g), torch.randn(3, 2, 10, 8, generator=g)
    low, high = KVCache(store=KVQuantStore(name)), KVCache()
    for cache in (low, high):
        cache.update(0, k, v, (0, 10))
    fresh = torch.randn(3, 2, 4, 8, generator=g)
    got, want = low.update(0, fresh, fresh, (2, 6)), high.update(0, fresh, fresh, (2, 6))
    for a, b in zip(got, want):
        assert torch.all((a - b).abs() <= bound(b, name) * (1 + 1e-6))
    rows = torch.tensor([2, 0])
    for op in (lambda c: c.select_rows(rows), lambda c: c.trim(7), lambda c: c.pad_to(12)):
        a, b = op(low), op(high)
        assert a.store is low.store and a.keys[0].shape == b.keys[0].shape
        assert torch.all((a.store.read(a.keys[0]) - b.keys[0]).abs() <= bound(b.keys[0], name) * (1 + 1e-6))


@pytest.mark.parametrize("name", STORES)
@pytest.mark.parametrize("dtype,ratio", [(torch.bfloat16, 132 / 256), (torch.float32, 132 / 512)])
def test_stored_bytes_are_codes_plus_one_float32_scale_per_head_and_column(name, dtype, ratio):
    """LLaDA-8B's K/V shape (32 heads of 128): (D + 4) / (2 D) of bf16, (D + 4) / (4 D) of fp32."""
    k = torch.randn(1, 32, 96, 128).to(dtype)
    low, high = KVCache(store=KVQuantStore(name)), KVCache()
    for cache in (low, high):
        cache.update(0, k, k, (0, 96))
    assert low.nbytes == 2 * (32 * 96 * 128 + 32 * 96 * 4) == 811_008
    assert high.nbytes == 2 * 32 * 96 * 128 * dtype.itemsize
    assert low.nbytes / high.nbytes == ratio


@pytest.mark.parametrize("name", STORES)
def test_a_decode_stores_the_models_kv_dtype_in_every_layer(name):
    """Through the dual cache of a bf16 tiny LLaDA: every layer keeps codes, and the whole cache
    is (D + 4) / (2 D) of the float one (D = 8 here: 0.75x)."""
    model = tiny_llada(layers=2).to(torch.bfloat16)
    canvas = torch.randint(0, 30, (2, 12))
    states = []
    for value in ("auto", name):
        set_kv_cache_dtype(model, value)
        state = CACHES["dual"]().init_state(model)
        model(canvas, kv=state, rows=(0, 12))
        states.append(state)
    float_kv, low = states
    assert kv_cache_dtype(model) == name and len(low.keys) == 2
    head_dim = float_kv.keys[0].shape[-1]
    assert low.nbytes / float_kv.nbytes == (head_dim + 4) / (2 * head_dim)
    assert low.keys[0].codes.dtype == {"fp8": torch.float8_e4m3fn, "int8": torch.int8}[name]


def prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(f"sort: {' '.join(str((i * 7 + j * 3) % 10) for j in range(6))}")
            for i in range(8)]


@pytest.mark.parametrize("model_name,cache,block", [("embedded", "dual", 16), ("embedded-bd", "block", 8)])
def test_decodes_with_low_precision_kv_agree_with_float_kv(model_name, cache, block):
    """8 prompts x 32 tokens on each embedded model: measured agreement (threshold 0.9) 100% /
    99.2% for int8, 98.0% / 79.7% for fp8 (a token that flips changes the rest of its block);
    asserted with slack, and fp8 must still change something (the store is in the path)."""
    model = load_model(model_name)
    cfg = DecodeConfig(scheduler=ThresholdScheduler(threshold=0.9), cache=CACHES[cache](),
                       gen_length=32, block_length=block)
    base = generate(model, prompts(model.tokenizer), cfg).tokens
    agree = {}
    for name in STORES:
        set_kv_cache_dtype(model, name)
        agree[name] = (generate(model, prompts(model.tokenizer), cfg).tokens == base).float().mean().item()
    assert agree["int8"] >= 0.95 and agree["fp8"] >= 0.7, agree
    none = dataclasses.replace(cfg, cache=CACHES["none"]())      # nothing stored: no effect
    assert torch.equal(generate(model, prompts(model.tokenizer), none).tokens,
                       generate(set_kv_cache_dtype(model, "auto"), prompts(model.tokenizer), none).tokens)


@pytest.mark.parametrize("name", STORES)
def test_static_store_packs_codes_and_scales_and_reads_what_the_eager_store_reads(name):
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    static = StaticKVCache.allocate((1, 2, 2, 7, 8), torch.float32, "cpu", KVQuantStore(name))
    assert static.keys.shape == (1, 2, 2, 7, 12) and static.keys.element_size() == 1
    fed = torch.tensor([0, 1, 2, 3, 4])
    sk, sv = static.update(0, k, v, fed)
    eager = KVCache(store=KVQuantStore(name))
    ek, ev = eager.update(0, k, v, (0, 5))
    assert torch.equal(sk[:, :, :5], ek) and torch.equal(sv[:, :, :5], ev)


@pytest.mark.parametrize("name", STORES)
@pytest.mark.parametrize("family,cache", [("llada", "dual"), ("sdar", "block")])
def test_captured_step_with_low_precision_kv_equals_its_eager_decode(name, family, cache):
    model = tiny_llada(layers=2) if family == "llada" else tiny_block_diffusion("sdar", block_size=4)
    set_kv_cache_dtype(model, name)
    cfg = DecodeConfig(scheduler=ThresholdScheduler(threshold=0.3), cache=CACHES[cache](),
                       gen_length=16, block_length=4, stop_at_eos=False)
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]
    graphs = GraphCache("static")
    eager = generate(model, prompts, cfg)
    captured = generate(model, prompts, cfg, capture=graphs)
    assert torch.equal(captured.tokens, eager.tokens) and torch.equal(captured.nfe, eager.nfe)
    kept = {b.kv.keys.dtype for b in graphs.buffers.values()}
    assert kept == {torch.int8 if name == "int8" else torch.uint8}      # the packed store ran


def test_bad_kv_cache_dtype_is_one_line():
    assert KV_CACHE_DTYPES == ("auto", "fp8", "int8") and kv_store_of("auto") is None
    for bad in ("fp4", "FP8", 8, True):
        with pytest.raises(KVCacheDtypeError, match=r"kv_cache_dtype must be one of \['auto', 'fp8', 'int8'\]"):
            kv_store_of(bad)
    with pytest.raises(KVCacheDtypeError, match="kv_cache_dtype must be one of"):
        load_model("embedded", kv_cache_dtype="e5m2")

    class NoKV(torch.nn.Module):
        supports_kv = False

    with pytest.raises(KVCacheDtypeError, match="fp8 needs a model with a KV cache, and NoKV has none"):
        set_kv_cache_dtype(NoKV(), "fp8")
    assert kv_cache_dtype(set_kv_cache_dtype(NoKV(), "auto")) == "auto"
    assert load_model("embedded", kv_cache_dtype="int8").kv_store == KVQuantStore("int8")
    assert KVCache.for_model(NoKV()).store is FLOAT_STORE


def cli(*args: str):
    from click.testing import CliRunner

    from dllm_decode.cli import main

    return CliRunner().invoke(main, list(args))


def test_every_entry_point_takes_the_same_option_and_refuses_the_same_way(tmp_path):
    """decode, eval, serve and bench cache: `--kv-cache-dtype auto|fp8|int8`, the same choice list
    as the Python API, a bad value or a model without K/V a one-line usage error (exit 2)."""
    from dllm_decode.cli.options import KV_CACHE_DTYPES as CLI_CHOICES

    assert CLI_CHOICES == KV_CACHE_DTYPES
    for command in ((), ("eval",), ("serve",), ("bench", "cache")):
        bad = cli(*command, "--kv-cache-dtype", "fp4")
        assert bad.exit_code == 2 and "'fp4' is not one of 'auto', 'fp8', 'int8'" in bad.output, bad.output
    for command in (("--prompt", "x"), ("eval", "--tasks", "sort", "--limit", "1", "--out", str(tmp_path / "e"))):
        ideal = cli(*command, "--model", "ideal", "--kv-cache-dtype", "fp8")
        assert ideal.exit_code == 2 and "--kv-cache-dtype applies to a diffusion LM checkpoint" in ideal.output
    served = cli("serve", "--model", "ar:smollm2", "--kv-cache-dtype", "int8")
    assert served.exit_code == 2 and "--kv-cache-dtype applies to a diffusion LM" in served.output
    done = cli("--prompt", "sort: 3 1 2", "--cache", "dual", "--kv-cache-dtype", "int8", "--json")
    assert done.exit_code == 0, done.output


def test_eval_labels_and_resumes_by_the_kv_cache_dtype(tmp_path):
    from dllm_decode.runkey import load_identity

    assert load_identity(kv_cache_dtype="fp8") == {"kv_cache_dtype": "fp8"} and load_identity() == {}
    out = tmp_path / "e"
    ran = cli("eval", "--model", "embedded", "--tasks", "sort", "--limit", "1", "--cache", "dual",
              "--kv-cache-dtype", "fp8", "--no-plots", "--no-progress", "--out", str(out))
    assert ran.exit_code == 0, ran.output
    assert "embedded --kv-cache-dtype fp8" in (out / "samples.jsonl").read_text()


@pytest.mark.parametrize("name", STORES)
def test_compiled_step_over_the_packed_store_has_no_graph_break(name):
    import torch._dynamo
    from torch._dynamo.utils import counters

    model = set_kv_cache_dtype(tiny_llada(layers=2), name)
    cfg = DecodeConfig(scheduler=ThresholdScheduler(threshold=0.3), cache=CACHES["dual"](),
                       gen_length=8, block_length=4, stop_at_eos=False)
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    torch._dynamo.reset()
    counters.clear()
    graphs = GraphCache("compile", backend="eager")
    try:
        captured = generate(model, prompts, cfg, capture=graphs)
        assert not counters["graph_break"], dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()
    assert graphs.captures >= 1
    assert torch.equal(captured.tokens, generate(model, prompts, cfg).tokens)
