"""Independent probes of today's changes (packing, the compact weight check, serve replies,
serving records, join invariance, answer-length canvases, DiffusionGemma's prefix cache).

Each case compares two paths with a stated float tolerance (`assert_logits_close`) or compares
discrete decodes (`assert_decodes_agree` where near ties may flip a row)."""

from __future__ import annotations

import copy

import pytest
import torch

from dllm_decode.models import KVCache
from dllm_decode.models.compact import set_runtime
from dllm_decode.testing import assert_logits_close, tiny_block_diffusion, tiny_llada
from tests.models.conftest import make_dream, make_llada

FAMILIES = {
    "llada": lambda: make_llada(),
    "dream": lambda: make_dream(),
    "fast_dllm": lambda: tiny_block_diffusion("fast_dllm", block_size=4),
    "sdar": lambda: tiny_block_diffusion("sdar", block_size=4),
    "llada2": lambda: tiny_block_diffusion("llada2", block_size=4),
}
L = 12
COMPACT = sorted(set(FAMILIES) - {"llada2"})      # LLaDA2 (MoE) is refused by the compact runtime


def forward(model, ids, mask, **kwargs):
    with torch.inference_mode():
        return model(ids, attention_mask=mask, **kwargs)


def odd_batch(seed=3):
    """Rows: full, one real token, half, padding in the middle (a 0 after a 1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 35, (4, L), generator=g)
    mask = torch.ones(4, L, dtype=torch.long)
    mask[1, :L - 1] = 0
    mask[2, :L // 2] = 0
    mask[3, :3] = 0
    mask[3, 6] = 0                       # a hole in the middle: must not be dropped
    return ids, mask


def both(model, ids, mask, **kwargs):
    set_runtime(model, "reference")
    ref = forward(model, ids, mask, **kwargs)
    set_runtime(model, "compact")
    ours = forward(model, ids, mask, **kwargs)
    return ours, ref


@pytest.mark.parametrize("name", COMPACT)
def test_packed_logits_equal_reference_at_real_columns(name):
    model = FAMILIES[name]()
    ids, mask = odd_batch()
    ours, ref = both(model, ids, mask)
    real = mask.bool()
    assert_logits_close(ours[real], ref[real])
    ours, ref = both(model, ids, mask, rows=(L - 4, L))
    assert_logits_close(ours[real[:, L - 4:]], ref[real[:, L - 4:]])


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_packed_rows_equal_each_row_alone(name):
    model = set_runtime(FAMILIES[name](), "compact" if name in COMPACT else "reference")
    ids, mask = odd_batch()
    mask[3] = 1                                       # left padding only here
    mask[3, :5] = 0
    together = forward(model, ids, mask)
    for r in range(ids.shape[0]):
        start = int((mask[r] == 0).sum())
        alone = forward(model, ids[r:r + 1, start:], None)
        assert_logits_close(together[r:r + 1, start:], alone)


@pytest.mark.parametrize("name", COMPACT)
def test_packed_cached_step_equals_reference(name):
    model = FAMILIES[name]()
    ids, mask = odd_batch()

    def steps(runtime):
        set_runtime(model, runtime)
        kv = KVCache()
        full = forward(model, ids, mask, kv=kv, rows=(0, L))
        edited = ids.clone()
        edited[:, L - 4:] = torch.arange(4)
        step = forward(model, edited, mask, kv=kv, rows=(L - 4, L))
        return full, step

    (f1, s1), (f0, s0) = steps("compact"), steps("reference")
    real = mask.bool()
    assert_logits_close(f1[real], f0[real])
    assert_logits_close(s1[real[:, L - 4:]], s0[real[:, L - 4:]])


def test_packed_bf16_close_to_reference_bf16():
    model = make_llada().to(torch.bfloat16)
    ids, mask = odd_batch()
    ours, ref = both(model, ids, mask)
    real = mask.bool()
    assert ours[real].isfinite().all()
    err = (ours[real].float() - ref[real].float()).abs().max()
    assert err <= 0.05 * ref[real].float().abs().max()


def test_packed_int8_embedded_equals_reference():
    from dllm_decode.models import load_model
    model = load_model("embedded", quantize="int8")
    ids, mask = odd_batch()
    ids = ids % 30
    ours, ref = both(model, ids, mask)
    real = mask.bool()
    assert_logits_close(ours[real], ref[real])


def test_decodes_with_very_different_prompt_lengths_equal_alone():
    from dllm_decode import DecodeConfig, generate
    from dllm_decode.registry import component, registry
    from dllm_decode.testing import assert_decodes_agree
    model = set_runtime(tiny_llada(seed=4), "compact")
    prompts = [[3], list(range(1, 30)), [5, 6, 7, 8, 9, 10, 11]]
    for cache in ["none", "prefix", "dual", "d2", "elastic", "suffix", "dllm_cache", "dkv", "es"]:
        config = DecodeConfig(scheduler=component("scheduler", "low_confidence"),
                              cache=component("cache", cache), gen_length=8, block_length=4)
        together = generate(model, prompts, config)
        for i, p in enumerate(prompts):
            alone = generate(model, [p], config)
            assert_decodes_agree(_row(together, i), alone, rows_may_flip=0)


def _row(result, i):
    import dataclasses
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    return type(result)(**{k: (v[i:i + 1] if isinstance(v, torch.Tensor) and v.dim() >= 1
                              and v.shape[0] == result.tokens.shape[0] else v)
                           for k, v in fields.items()})


# ---- class 2: the per-forward weight check --------------------------------------------------


def check_reaches(model, edit):
    ids, mask = odd_batch()
    set_runtime(model, "compact")
    forward(model, ids, mask)
    edit(model)
    ours = forward(model, ids, mask)
    ref_model = copy.deepcopy(model)
    set_runtime(ref_model, "reference")
    real = mask.bool()
    assert_logits_close(ours[real], forward(ref_model, ids, mask)[real])
    return ours


def check_changes_and_reaches(model, edit, ids, mask):
    """`check_reaches` for a model holding inference tensors (no deepcopy): the edit changes the
    logits, and the compact forward after it equals the same model's reference runtime."""
    set_runtime(model, "compact")
    before = forward(model, ids, mask)
    edit(model)
    ours = forward(model, ids, mask)
    set_runtime(model, "reference")
    ref = forward(model, ids, mask)
    real = mask.bool()
    assert not torch.allclose(ref[real], before[real])
    assert_logits_close(ours[real], ref[real])


def a_linear(model):
    block = model.parts()[1][0]
    return next(m for m in block.modules() if isinstance(m, torch.nn.Linear))


def test_in_place_data_edit_reaches_next_forward():
    def edit(m):
        a_linear(m).weight.data.mul_(1.7)
    check_reaches(make_llada(), edit)


@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict_reaches_next_forward(assign):
    other = make_llada(seed=5)
    check_reaches(make_llada(), lambda m: m.load_state_dict(other.state_dict(), assign=assign))


def test_replaced_submodule_reaches_next_forward():
    def edit(m):
        block = m.parts()[1][0]
        for name, child in list(block.named_children()):
            if isinstance(child, torch.nn.Linear):
                new = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                with torch.no_grad():
                    new.weight.copy_(child.weight * -1)
                    if child.bias is not None:
                        new.bias.copy_(child.bias)
                setattr(block, name, new)
                return
        raise AssertionError("no linear child")
    check_reaches(make_llada(), edit)


def test_dtype_change_reaches_next_forward():
    model = make_llada()
    ids, mask = odd_batch()
    set_runtime(model, "compact")
    forward(model, ids, mask)
    model.to(torch.float64)
    ours = forward(model, ids, mask)
    ref = copy.deepcopy(model)
    set_runtime(ref, "reference")
    real = mask.bool()
    assert_logits_close(ours[real].float(), forward(ref, ids, mask)[real].float())


def test_parametrize_reaches_next_forward():
    from torch.nn.utils import parametrize

    class Double(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    model = make_llada()
    ids, mask = odd_batch()
    set_runtime(model, "compact")
    before = forward(model, ids, mask)
    parametrize.register_parametrization(a_linear(model), "weight", Double())
    try:
        ours = forward(model, ids, mask)
    except ValueError:
        return                       # refused with a message: the edit is not silently lost
    ref = copy.deepcopy(model)
    set_runtime(ref, "reference")
    real = mask.bool()
    assert not torch.allclose(ours, before)
    assert_logits_close(ours[real], forward(ref, ids, mask)[real])


def test_deepcopy_then_edit_copy_only():
    model = make_llada()
    ids, mask = odd_batch()
    set_runtime(model, "compact")
    before = forward(model, ids, mask)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        a_linear(twin).weight.mul_(-1)
    twin_out = forward(twin, ids, mask)
    assert_logits_close(forward(model, ids, mask), before)      # the original is untouched
    ref = copy.deepcopy(twin)
    set_runtime(ref, "reference")
    real = mask.bool()
    assert_logits_close(twin_out[real], forward(ref, ids, mask)[real])
    assert not torch.allclose(twin_out[real], before[real])


def test_register_buffer_on_quantized_layer_reaches_next_forward():
    from dllm_decode.models import load_model
    model = load_model("embedded", quantize="int8")
    ids, mask = odd_batch()
    ids = ids % 30
    set_runtime(model, "compact")
    before = forward(model, ids, mask)
    layer = next(m for m in model.modules() if hasattr(type(m), "fuse_rows"))
    name, buf = next((n, b) for n, b in layer._buffers.items() if b is not None and b.is_floating_point())
    layer.register_buffer(name, buf * 1.5)
    ours = forward(model, ids, mask)
    ref = copy.deepcopy(model)
    set_runtime(ref, "reference")
    real = mask.bool()
    assert not torch.allclose(ours[real], before[real])
    assert_logits_close(ours[real], forward(ref, ids, mask)[real])


# ---- class 5: joins through the Engine --------------------------------------------------------

JOIN_CACHES = ["prefix", "dual", "elastic", "dllm_cache", "es", "d2", "suffix"]


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", JOIN_CACHES)
def test_engine_joins_sampled_more_than_held_batches_with_a_cancel(cache, family):
    """Six sampled requests (own seeds) arriving at steps 0..5 (more than HELD_BATCHES running
    batches' worth), one running request cancelled while others wait: each finished answer
    equals the request decoded alone."""
    import dataclasses
    from dllm_decode.config import DecodeConfig
    from dllm_decode.engine import Engine, HELD_BATCHES, Request
    from dllm_decode.registry import component
    from dllm_decode.sampler import generate
    from dllm_decode.testing import tiny_llada_with_tokenizer

    if family == "llada":
        model = tiny_llada_with_tokenizer()
    else:
        from dllm_decode.testing import tiny_tokenizer
        model = make_dream(seed=3)
        model.tokenizer = tiny_tokenizer()
    cfg = DecodeConfig(scheduler=component("scheduler", "low_confidence"),
                       cache=component("cache", cache), gen_length=12, block_length=4,
                       temperature=0.8)
    from dllm_decode.engine import check_cache
    try:
        check_cache(model, cfg)
    except ValueError:
        pytest.skip(f"{family} does not take cache {cache}")
    prompts = [[3, 4], [5, 6, 7, 8, 9], [10], [11, 12, 13], [1, 2, 3, 4, 5, 6, 7], [14, 15]]
    assert len(prompts) > HELD_BATCHES
    requests = [Request(f"q{i}", p, dataclasses.replace(cfg, seed=10 + i)) for i, p in enumerate(prompts)]
    engine = Engine(model, max_batch_size=3)
    outputs, step = {}, 0
    pending = list(requests)
    while pending or engine.has_work:
        if pending:
            engine.add(pending.pop(0))
        if step == 3:
            assert engine.cancel("q1")
        for u in engine.step():
            if u.finished:
                outputs[u.request_id] = u.output
        step += 1
    assert outputs["q1"].finish_reason == "cancelled"
    for request in requests:
        if request.id == "q1":
            continue
        alone = generate(model, [list(request.prompt)], request.config)
        answer = alone.tokens[0].tolist()
        eos = next((i for i, t in enumerate(answer) if t in model.eos_token_ids), len(answer))
        assert list(outputs[request.id].tokens) == answer[:eos], request.id


# ---- class 3: replies never show the server's folders -----------------------------------------


def _folder_model(root, name="ckpt", relative=False):
    import os
    from dllm_decode.models import load_model
    from dllm_decode.testing import tiny_tokenizer

    directory = root / "hidden_parent_x7" / name
    make_llada(layers=1).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(str(directory))
    if not relative:
        return load_model(directory), directory
    cwd = os.getcwd()
    os.chdir(directory.parent)
    try:
        return load_model(name), directory
    finally:
        os.chdir(cwd)


def _replies(model, directory):
    """Model-side errors: 400s from dllm options, a 500 from NaN logits, plain and streamed."""
    import json
    import urllib.request
    from dllm_decode.serve.app import background
    from tests.serve.conftest import make_state, post

    state = make_state(model)
    bodies = []
    bad = [{"cache": "block"}, {"scheduler": {"name": "uniform_noise", "steps": 4}},
           {"gen_length": 100000}, {"cache": "dual", "block_length": 7, "gen_length": 32}]
    with background(state) as url:
        for dllm in bad:
            for stream in (False, True):
                status, body = post(url, "/v1/completions", {"prompt": "w1 w2", "max_tokens": 16,
                                                             "stream": stream, "dllm": dllm})
                bodies.append((status, json.dumps(body)))
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        status, body = post(url, "/v1/completions", {"prompt": "w1 w2", "max_tokens": 16})
        bodies.append((status, json.dumps(body)))
        request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(
            {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 16, "stream": True}).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                bodies.append((response.status, response.read().decode()))
        except urllib.error.HTTPError as err:
            bodies.append((err.code, err.read().decode()))
    return bodies


@pytest.mark.parametrize("relative", [False, True])
def test_error_replies_never_show_the_model_folder(tmp_path, relative):
    model, directory = _folder_model(tmp_path, relative=relative)
    bodies = _replies(model, directory)
    assert any(status >= 500 or "error" in text for status, text in bodies[-2:]), bodies[-2:]
    assert any(status == 400 for status, _ in bodies)
    for status, text in bodies:
        assert str(directory) not in text and "hidden_parent_x7" not in text, (status, text)
        if relative:
            assert "ckpt" not in text, (status, text)


def test_error_replies_never_show_a_named_adapter_folder(tmp_path):
    import json
    from dllm_decode.adapters import attach, read_adapter
    from dllm_decode.models import load_model
    from dllm_decode.serve.app import background
    from tests.serve.conftest import post
    from tests.test_adapters import save_adapter

    pytest.importorskip("peft")
    model = load_model("embedded")
    folder = tmp_path / "adapter_parent_q3" / "lora_one"
    save_adapter(model, "llada", folder, 1)
    attach(model, [read_adapter(folder, "one")])
    from dllm_decode.engine import Engine
    from dllm_decode.serve.app import Limits, ServerState
    from dllm_decode.serve.protocol import Settings
    from dllm_decode.serve.worker import EngineWorker
    from tests.serve.conftest import default_config

    settings = Settings(model_id="embedded", config=default_config(gen_length=16, block_length=8),
                        max_tokens=64, adapters=("one",))
    state = ServerState(EngineWorker(Engine(model, max_batch_size=4), threads=1), settings, Limits())
    texts = []
    with background(state) as url:
        for body in [{"model": "embedded:one", "dllm": {"cache": "block"}},
                     {"model": "embedded:one", "dllm": {"gen_length": 30, "block_length": 7}},
                     {"model": "embedded:two"}, {"model": "embedded:one", "stream": True,
                                                 "dllm": {"cache": "block"}}]:
            status, reply = post(url, "/v1/completions", {"prompt": "sort: 3 1", "max_tokens": 16, **body})
            assert status >= 400
            texts.append(json.dumps(reply))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora" in name.lower():
                    p.fill_(float("nan"))
        status, reply = post(url, "/v1/completions", {"prompt": "sort: 3 1", "max_tokens": 16,
                                                      "model": "embedded:one"})
        texts.append(json.dumps(reply))
    for text in texts:
        assert str(folder) not in text and "adapter_parent_q3" not in text and "lora_one" not in text, text


# ---- class 4: shared decode records, inline bodies -------------------------------------------


@pytest.fixture(scope="module")
def tiny_server():
    from dllm_decode.serve.app import background
    from dllm_decode.testing import tiny_llada_with_tokenizer
    from tests.serve.conftest import default_config, make_state

    model = tiny_llada_with_tokenizer()
    state = make_state(model, config=default_config(gen_length=16, block_length=4))
    with background(state) as url:
        yield url, model


def _offline(model, prompt, **fields):
    from dllm_decode.sampler import generate
    from tests.serve.conftest import default_config

    fields = {"gen_length": 16, "block_length": 4, **fields}
    ids = model.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return generate(model, [ids], default_config(**fields)).text[0]


def test_requests_differing_in_one_setting_do_not_share_a_record(tiny_server):
    from tests.serve.conftest import post, sse

    url, model = tiny_server
    prompt = "w1 w2 w3"
    cases = [({}, {}), ({"temperature": 0.9, "seed": 3}, {"temperature": 0.9, "seed": 3}),
             ({}, {}), ({"temperature": 0.9, "seed": 4}, {"temperature": 0.9, "seed": 4}),
             ({"seed": 7}, {"seed": 7}), ({"max_tokens": 8}, {"gen_length": 8}),
             ({}, {}), ({"dllm": {"block_length": 8}}, {"block_length": 8}),
             ({"dllm": {"gen_length": 8}}, {"gen_length": 8}), ({}, {}),
             ({"temperature": 0.9}, {"temperature": 0.9})]
    for extra, fields in cases:
        status, body = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 16, **extra})
        assert status == 200, body
        expected = _offline(model, prompt, **fields)
        limit = extra.get("max_tokens", 16)
        got = body["choices"][0]["text"]
        assert got.strip() == expected.strip() or expected.startswith(got), (extra, got, expected)
        assert body["dllm"]["config"]["temperature"] == fields.get("temperature", 0.0), extra
    events = sse(url, "/v1/completions", {"prompt": prompt, "max_tokens": 16, "stream": True,
                                          "temperature": 0.9, "seed": 3})
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1] if e.get("choices"))
    assert streamed.strip() == _offline(model, prompt, temperature=0.9, seed=3).strip()


def test_a_refused_record_stays_refused_between_accepted_ones(tiny_server):
    from tests.serve.conftest import post

    url, _ = tiny_server
    for _ in range(3):
        status, body = post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 16,
                                                     "dllm": {"cache": "block"}})
        assert status == 400, body
        assert post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 16})[0] == 200
        status, body = post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 16,
                                                     "temperature": -1})
        assert status == 400, body


def test_a_body_just_over_inline_bytes_answers_as_one_just_under(tiny_server):
    from dllm_decode.serve.app import INLINE_BYTES
    from tests.serve.conftest import post

    url, _ = tiny_server
    replies = []
    for size in (INLINE_BYTES - 1, INLINE_BYTES, INLINE_BYTES + 1, INLINE_BYTES + 64):
        head = '{"prompt": "w4 w5 w6", "max_tokens": 16, "seed": 1'
        raw = head + " " * (size - len(head) - 1) + "}"
        assert len(raw.encode()) == size
        status, body = post(url, "/v1/completions", raw.encode())
        assert status == 200, body
        replies.append(body["choices"][0]["text"])
        bad = raw[:-1].replace('"seed": 1', '"seed": 1, "dllm": {"cache": "block"}', 1)
        bad = bad[:size - 1] + "}" if len(bad) > size else bad + "}"
        status, body = post(url, "/v1/completions", bad.encode())
        assert status == 400, body
    assert len(set(replies)) == 1


def test_health_answers_while_a_big_body_is_tokenised(tiny_server):
    import concurrent.futures
    import time
    import urllib.request
    from tests.serve.conftest import post

    url, _ = tiny_server
    big = {"prompt": "w1 " * 300000, "max_tokens": 16}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(post, url, "/v1/completions", big)
        time.sleep(0.05)
        start = time.perf_counter()
        with urllib.request.urlopen(url + "/health", timeout=30) as response:
            assert response.status == 200
        health = time.perf_counter() - start
        status, _ = future.result()
    assert status in (400, 413)
    assert health < 1.0


# ---- class 6: --gen-length answer on a block-diffusion or noise model --------------------------


def test_answer_canvas_rounds_up_to_the_grid_and_a_fixed_one_is_kept():
    from dllm_decode.eval.harness.grid import Setting

    answer = Setting("threshold", gen_length=None)
    assert [answer.canvas_for(n, 8) for n in (1, 7, 8, 9, 16, 17)] == [8, 8, 8, 16, 16, 24]
    assert [answer.canvas_for(n, None) for n in (3, 9)] == [3, 9]        # no grid: the answer
    assert answer.block_for(answer.canvas_for(5, 8), 8) == 8
    assert answer.decode_config(answer.canvas_for(13, 8), 8).gen_length == 16
    user = Setting("threshold", gen_length=None, block_length=4)
    assert user.block_for(user.canvas_for(5, 8), 8) == 4                 # divides the grid: kept
    fixed = Setting("threshold", gen_length=12)
    assert fixed.canvas_for(12, 8) == 12                                 # a fixed canvas unchanged
    tps = Setting("low_confidence", options=(("tokens_per_step", "2"),), gen_length=None)
    cfg = tps.decode_config(tps.canvas_for(5, 8), 8)
    assert cfg.gen_length == 8 and cfg.block_length == 8 and cfg.scheduler.steps_per_block == 4


def _eval(tmp_path, *args):
    import json
    from click.testing import CliRunner
    from dllm_decode.cli import main
    from dllm_decode.eval.harness.records import read_records

    result = CliRunner().invoke(main, ["eval", "--tasks", "copy", "--scheduler", "threshold",
                                       "--limit", "3", "--out", str(tmp_path), "--json", "--no-plots",
                                       *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["results"], read_records(tmp_path / "samples.jsonl")


def test_answer_length_on_the_noise_model(tmp_path):
    (cell,), records = _eval(tmp_path, "--model", "embedded-noise", "--gen-length", "answer")
    assert cell["accuracy"] == 100.0 and len(records) == 3


def test_a_fixed_gen_length_on_a_block_diffusion_model_is_unchanged(tmp_path):
    (cell,), records = _eval(tmp_path, "--model", "embedded-bd", "--gen-length", "16")
    assert {r["gen_length"] for r in records} == {16} and cell["accuracy"] == 100.0


@pytest.mark.parametrize("model, block", [("embedded-bd", "4"), ("embedded-bd", "8"), ("embedded-noise", "8")])
def test_answer_length_with_a_block_that_divides_the_grid(tmp_path, model, block):
    (cell,), records = _eval(tmp_path, "--model", model, "--gen-length", "answer",
                             "--block-length", block)
    assert cell["accuracy"] == 100.0 and len(records) == 3


def test_tune_answer_length_on_a_block_diffusion_model(tmp_path):
    import json
    from click.testing import CliRunner
    from dllm_decode.cli import main

    result = CliRunner().invoke(main, ["tune", "--model", "embedded-bd", "--tasks", "copy", "--calibration", "4",
                                       "--held-out", "4", "--rules", "threshold", "--caches", "none",
                                       "--gen-length", "answer", "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "held out: 100.0%" in result.output
    assert json.loads((tmp_path / "presets.json").read_text())


# ---- class 7: DiffusionGemma's encoder prefix cache -------------------------------------------


def _gemma_requests(model, shared):
    from dllm_decode.config import DecodeConfig
    from dllm_decode.engine import Request
    from tests.test_encoder_prefix import prompt

    config = DecodeConfig.for_model(model, 8)
    base = prompt(shared + 1, 40)
    out = [Request("base", base + prompt(5, 41), config)]
    for i, delta in enumerate((-1, 0, 1)):                       # share chunk-1 / chunk / chunk+1
        head = base[:shared + delta]
        out.append(Request(f"s{i}", head + prompt(6, 50 + i), config))
    out += [Request("short1", base[:3], config), Request("short2", base[:3] + prompt(2, 60), config),
            Request("exact", base[:shared], config)]
    return out


@pytest.mark.parametrize("shared", [8, 16, 24])
@pytest.mark.parametrize("budget_chunks", [1, 64])
def test_gemma_prefix_cache_at_chunk_boundaries(shared, budget_chunks):
    from dllm_decode.testing import tiny_diffusion_gemma
    from tests.test_encoder_prefix import chunk_bytes, serve_all

    model = tiny_diffusion_gemma(seed=2, steps=4)
    budget = budget_chunks * chunk_bytes(model)
    without, _ = serve_all(model, _gemma_requests(model, shared), 0)
    with_cache, engine = serve_all(model, _gemma_requests(model, shared), budget)
    assert {k: v.tokens for k, v in with_cache.items()} == {k: v.tokens for k, v in without.items()}
    assert engine.prefix.stats().resident_bytes <= budget
    if budget_chunks > 1:
        assert with_cache["s1"].cached_tokens > 0 or with_cache["s2"].cached_tokens > 0


def test_gemma_prefix_cache_fp8_store_keeps_what_is_exact():
    """A low-precision store is not float-exact where a prompt's tail attends stored codes
    (documented in encoder_reuse); prompts shorter than a chunk (nothing reused) and a prompt
    wholly stored (its codes read back as held) still give the tokens they give without it."""
    from dllm_decode.quant.kv import set_kv_cache_dtype
    from dllm_decode.testing import tiny_diffusion_gemma
    from tests.test_encoder_prefix import serve_all

    model = tiny_diffusion_gemma(seed=2, steps=4)
    try:
        set_kv_cache_dtype(model, "fp8")
    except ValueError as err:
        pytest.skip(f"fp8 K/V store refused here: {err}")
    without, _ = serve_all(model, _gemma_requests(model, 16), 0)
    with_cache, _ = serve_all(model, _gemma_requests(model, 16), 1 << 24)
    assert with_cache["exact"].cached_tokens == 16 and with_cache["s1"].cached_tokens == 16
    for key in ("base", "short1", "short2", "exact"):
        assert with_cache[key].tokens == without[key].tokens, key


def test_deleting_a_block_reaches_next_forward():
    """Layer dropping (`del blocks[i]`) registers nothing: the kept module list must still see it."""
    def edit(m):
        del m.parts()[1][1]
    model = make_llada(layers=3)
    check_reaches(model, edit)


def test_appending_a_block_reaches_next_forward():
    def edit(m):
        blocks = m.parts()[1]
        blocks.append(copy.deepcopy(blocks[0]))
    check_reaches(make_llada(layers=2), edit)


def test_inference_mode_edit_of_inference_tensors_reaches_next_forward():
    """A model built under inference_mode holds inference tensors (no version counter); an
    in-place edit made under inference_mode must still reach the compact forward."""
    with torch.inference_mode():
        model = make_llada()
    def edit(m):
        with torch.inference_mode():
            a_linear(m).weight.mul_(-1.5)
    check_changes_and_reaches(model, edit, *odd_batch())


def test_edits_outside_the_blocks_reach_next_forward():
    """The embedding and the final norm are outside the stack: edits there reach the forward."""
    def edit(m):
        with torch.no_grad():
            m.parts()[0].weight.mul_(0.5)
            m.model.transformer["ln_f"].weight.add_(0.3)
    check_reaches(make_llada(), edit)


def test_dtype_round_trip_then_edit_reaches_next_forward():
    def edit(m):
        m.to(torch.bfloat16)
        m.to(torch.float32)
        with torch.no_grad():
            a_linear(m).weight.add_(0.2)
    check_reaches(make_llada(), edit)


def test_inserting_a_block_reaches_next_forward():
    def edit(m):
        blocks = m.parts()[1]
        new = copy.deepcopy(blocks[0])
        with torch.no_grad():
            for p in new.parameters():
                p.mul_(1.1)
        blocks.insert(1, new)
    check_reaches(make_llada(layers=2), edit)


def test_popping_a_block_reaches_next_forward():
    check_reaches(make_llada(layers=3), lambda m: m.parts()[1].pop(1))


@pytest.mark.parametrize("name", ["dream", "fast_dllm", "sdar", "llada2"])
def test_family_decodes_with_very_different_prompt_lengths_equal_alone(name):
    """Each cache the family takes: a batch of a 1-token, a 29-token and a 7-token prompt gives
    each row the tokens it gives alone (compact runtime where it applies)."""
    from dllm_decode import DecodeConfig, generate
    from dllm_decode.engine import check_cache
    from dllm_decode.registry import component, registry
    from dllm_decode.testing import assert_decodes_agree

    model = set_runtime(FAMILIES[name](), "compact" if name in COMPACT else "reference")
    prompts = [[3], list(range(1, 30)), [5, 6, 7, 8, 9, 10, 11]]
    ran = 0
    for cache in sorted(registry("cache")):
        config = DecodeConfig(scheduler=component("scheduler", "low_confidence"),
                              cache=component("cache", cache), gen_length=8, block_length=4)
        try:
            check_cache(model, config)
        except ValueError:
            continue
        ran += 1
        together = generate(model, prompts, config)
        for i, p in enumerate(prompts):
            assert_decodes_agree(_row(together, i), generate(model, [p], config), rows_may_flip=0)
    assert ran >= 2


@pytest.mark.parametrize("cache", JOIN_CACHES)
def test_engine_joins_under_an_adaptive_rule_equal_alone(cache):
    """A threshold rule (rows finish blocks at different steps), greedy, room for every request
    (all may join running batches), seven requests arriving one a step."""
    from dllm_decode.config import DecodeConfig
    from dllm_decode.engine import Engine, Request
    from dllm_decode.registry import component
    from dllm_decode.sampler import generate
    from dllm_decode.testing import tiny_llada_with_tokenizer

    model = tiny_llada_with_tokenizer()
    cfg = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": 0.3}),
                       cache=component("cache", cache), gen_length=16, block_length=4)
    prompts = [[3, 4], [5, 6, 7, 8, 9], [10], [11, 12, 13], [1, 2, 3, 4, 5, 6, 7], [14, 15], [20] * 11]
    engine = Engine(model, max_batch_size=8)
    outputs, pending = {}, [Request(f"q{i}", p, cfg) for i, p in enumerate(prompts)]
    requests = list(pending)
    while pending or engine.has_work:
        if pending:
            engine.add(pending.pop(0))
        outputs.update({u.request_id: u.output for u in engine.step() if u.finished})
    for request in requests:
        alone = generate(model, [list(request.prompt)], request.config).tokens[0].tolist()
        eos = next((i for i, t in enumerate(alone) if t in model.eos_token_ids), len(alone))
        assert list(outputs[request.id].tokens) == alone[:eos], request.id


@pytest.fixture(scope="module")
def int8_embedded():
    from dllm_decode.models import load_model
    return load_model("embedded", quantize="int8")


def test_packed_int8_cached_step_equals_reference(int8_embedded):
    model = copy.deepcopy(int8_embedded)
    ids, mask = odd_batch()
    ids = ids % 30

    def steps(runtime):
        set_runtime(model, runtime)
        kv = KVCache()
        full = forward(model, ids, mask, kv=kv, rows=(0, L))
        edited = ids.clone()
        edited[:, L - 4:] = torch.arange(4)
        return full, forward(model, edited, mask, kv=kv, rows=(L - 4, L))

    (f1, s1), (f0, s0) = steps("compact"), steps("reference")
    real = mask.bool()
    assert_logits_close(f1[real], f0[real])
    assert_logits_close(s1[real[:, L - 4:]], s0[real[:, L - 4:]])


@pytest.mark.parametrize("how", ["in_place", "load_state_dict", "assign"])
def test_quantized_buffer_edits_reach_next_forward(int8_embedded, how):
    model = copy.deepcopy(int8_embedded)
    layer_name, layer = next((n, m) for n, m in model.named_modules() if hasattr(type(m), "fuse_rows"))
    name = next(n for n, b in layer._buffers.items() if b is not None and b.is_floating_point())

    def edit(m):
        with torch.inference_mode():             # the loaded codes are inference tensors
            if how == "in_place":
                getattr(layer, name).mul_(1.5)
                return
            state = {k: v.clone() for k, v in m.state_dict().items()}
            key = f"{layer_name}.{name}"
            state[key] = state[key] * 1.5
            m.load_state_dict(state, assign=how == "assign")

    ids, mask = odd_batch()
    check_changes_and_reaches(model, edit, ids % 30, mask)


def test_quantized_model_takes_a_state_dict_after_a_compact_decode():
    from dllm_decode import DecodeConfig, generate
    from dllm_decode.models import load_model
    from dllm_decode.registry import component

    model = set_runtime(load_model("embedded", quantize="int8"), "compact")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    config = DecodeConfig(scheduler=component("scheduler", "low_confidence"), gen_length=8, block_length=8)
    generate(model, [[10, 11, 12]], config)                   # the model has decoded once
    layer_name, layer = next((n, m) for n, m in model.named_modules() if hasattr(type(m), "fuse_rows"))
    name = next(n for n, b in layer._buffers.items() if b is not None and b.is_floating_point())
    state[f"{layer_name}.{name}"] = state[f"{layer_name}.{name}"] * 1.5
    model.load_state_dict(state)                               # an ordinary weight update
    ids, mask = odd_batch()
    ids = ids % 30
    ours = forward(model, ids, mask)
    set_runtime(model, "reference")
    real = mask.bool()
    assert_logits_close(ours[real], forward(model, ids, mask)[real])


def test_gemma_prefix_cache_keeps_two_adapters_apart(tmp_path):
    from dllm_decode.adapters import attach, read_adapter
    from dllm_decode.config import DecodeConfig
    from dllm_decode.engine import Request
    from dllm_decode.testing import tiny_diffusion_gemma
    from tests.test_encoder_prefix import prompt, serve_all
    from tests.test_prefix_cache import lora_folder

    model = tiny_diffusion_gemma(seed=2, steps=4)
    one = lora_folder(tmp_path / "one", {f"model.decoder.layers.{i}.self_attn.k_proj": (32, 32) for i in range(2)})
    two = lora_folder(tmp_path / "two", {f"model.decoder.layers.{i}.self_attn.k_proj": (32, 32) for i in range(2)},
                      rank=3)                                 # other weights on the same modules
    attach(model, [read_adapter(one, "one"), read_adapter(two, "two")])
    config = DecodeConfig.for_model(model, 8)
    system = prompt(24, 0)

    def requests():
        return [Request("t", system + prompt(4, 1), config, adapter="one"),
                Request("u", system + prompt(4, 2), config, adapter="two"),
                Request("v", system + prompt(4, 3), config, adapter="two"),
                Request("w", system + prompt(4, 4), config),
                Request("x", system + prompt(4, 5), config, adapter="one")]

    cached, _ = serve_all(model, requests(), 1 << 24, max_batch=1)
    alone, _ = serve_all(model, requests(), 0, max_batch=1)
    assert {k: v.cached_tokens for k, v in cached.items()} == {"t": 0, "u": 0, "v": 24, "w": 0, "x": 24}
    assert {k: v.tokens for k, v in cached.items()} == {k: v.tokens for k, v in alone.items()}


def test_error_replies_never_show_a_folder_given_with_a_trailing_slash(tmp_path):
    from dllm_decode.models import load_model
    from dllm_decode.testing import tiny_tokenizer

    directory = tmp_path / "hidden_parent_x7" / "ckpt"
    make_llada(layers=1).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(str(directory))
    model = load_model(str(directory) + "/")
    for status, text in _replies(model, directory):
        assert "hidden_parent_x7" not in text, (status, text)
