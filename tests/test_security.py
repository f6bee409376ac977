"""Nothing let in: the server never opens a file a request names, opt-ins are real booleans,
nothing is unpickled, checkpoint shards stay in their folder, and every route has a body-size,
body-time and nesting limit (with `/health` answering meanwhile)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request

import pytest
import torch

from tests.serve.conftest import make_state, post


# ---- per-request options never name files ------------------------------------------------

def _settings():
    from dllm_decode.config import DecodeConfig
    from dllm_decode.registry import component
    from dllm_decode.serve.protocol import Settings

    config = DecodeConfig(scheduler=component("scheduler", "threshold"), gen_length=16, block_length=8)
    return Settings(model_id="embedded", config=config, max_tokens=64)


def _refusal(embedded, dllm):
    from dllm_decode.serve.protocol import APIError, parse_job

    with pytest.raises(APIError) as caught:
        parse_job("completion", {"prompt": "sort : bob amy", "dllm": dllm}, _settings(), embedded.tokenizer)
    return caught.value


@pytest.mark.parametrize("weights", ["~/weights.safetensors", "../x.safetensors", "/etc/hostname",
                                     "relative-name", "EXISTING", "MISSING"])
def test_a_request_cannot_name_a_weights_file(embedded, tmp_path, weights):
    from dllm_decode.filters.mlp import SHIPPED_PATH

    weights = {"EXISTING": str(SHIPPED_PATH), "MISSING": str(tmp_path / "absent.safetensors")}.get(weights, weights)
    err = _refusal(embedded, {"filters": [{"name": "learned", "weights": weights}]})
    assert err.status == 400 and err.param == "dllm.filters[0].weights"
    # the same answer whether the file exists or not: no file-existence oracle
    assert "exist" not in err.message and "not found" not in err.message


def test_a_request_may_use_the_start_up_filter(embedded):
    from dllm_decode.serve.protocol import parse_job

    job = parse_job("completion", {"prompt": "sort : bob amy", "dllm": {"filters": [
        {"name": "learned", "weights": "embedded"}, "eotp"]}}, _settings(), embedded.tokenizer)
    assert [type(f).__name__ for f in job.config.filters] == ["LearnedFilter", "EoTPFilter"]


@pytest.mark.parametrize("verifier", ["ar_draft", "embedded-bd", "embedded", "relative-name"])
def test_a_request_cannot_choose_a_model_to_load(embedded, verifier):
    # apd's guide is a causal model loaded from a name or a directory: a start-up option
    err = _refusal(embedded, {"scheduler": {"name": "apd", "verifier": verifier}})
    assert err.status == 400 and err.param == "dllm.scheduler.verifier"


def test_a_request_may_use_apd_with_the_start_up_guide(embedded):
    from dllm_decode.serve.protocol import parse_job

    job = parse_job("completion", {"prompt": "sort : bob amy", "dllm": {"scheduler": {
        "name": "apd", "verifier": "auto"}}}, _settings(), embedded.tokenizer)
    assert type(job.config.scheduler).__name__ == "APDScheduler" and job.config.scheduler.verifier == "auto"


@pytest.mark.parametrize("dllm, param", [
    ({"filters": [{"name": "eotp", "mode": "../../etc"}]}, "dllm.filters[0].mode"),
    ({"cache": {"name": "suffix", "mode": "/tmp/x"}}, "dllm.cache.mode"),
    ({"scheduler": "~root"}, "dllm.scheduler"),
])
def test_no_option_value_looks_like_a_path(embedded, dllm, param):
    err = _refusal(embedded, dllm)
    assert err.status == 400 and err.param == param and "path" in err.message


@pytest.mark.parametrize("dllm, param", [
    ({"stop_at_eos": "false"}, "dllm.stop_at_eos"),
    ({"scheduler": {"name": "threshold", "threshold": "0.5"}}, "dllm.scheduler.threshold"),
    ({"scheduler": {"name": "threshold", "threshold": True}}, "dllm.scheduler.threshold"),
    ({"cache": {"name": "prefix", "refresh_every": "2"}}, "dllm.cache.refresh_every"),
])
def test_request_options_take_typed_values_only(embedded, dllm, param):
    err = _refusal(embedded, dllm)
    assert err.status == 400 and err.param == param


@pytest.mark.parametrize("body", [{"stop": ["x" * 100_000]}, {"max_tokens": 10 ** 30}])
def test_sizes_in_a_request_are_bounded_exactly(embedded, body):
    from dllm_decode.serve.protocol import APIError, parse_job

    with pytest.raises(APIError) as caught:
        parse_job("completion", {"prompt": "sort : bob", **body}, _settings(), embedded.tokenizer)
    assert caught.value.status == 400
    if "max_tokens" in body:                       # the exact size, not a float's rounding of it
        assert str(10 ** 30) in caught.value.message


def test_dotted_wrapper_options_are_bounded(embedded):
    err = _refusal(embedded, {"scheduler": {"name": "credit", "base" + ".base" * 40: "x"}})
    assert err.status == 400


# ---- typed trust ------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["false", "False", 0, 1, None, "yes"])
def test_trust_remote_code_takes_only_a_bool(value, tmp_path):
    from dllm_decode.models.checkpoint import load_tokenizer
    from dllm_decode.models.loading import load_model
    from dllm_decode.models.causal import load_causal_lm

    for call in (lambda: load_model("embedded", trust_remote_code=value),
                 lambda: load_causal_lm("ar_target", trust_remote_code=value),
                 lambda: load_tokenizer(tmp_path, trust_remote_code=value)):
        with pytest.raises(TypeError, match="trust_remote_code must be True or False"):
            call()


def test_training_resume_never_unpickles_code(tmp_path):
    from recipes.loop import load_checkpoint, save_checkpoint

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model": Payload()}, tmp_path / "checkpoint.pt")
    with pytest.raises(SystemExit, match="refused"):
        load_checkpoint(tmp_path / "checkpoint.pt")
    assert not marker.exists()
    # a real checkpoint still resumes
    model = torch.nn.Linear(2, 2)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optim.step()
    save_checkpoint(tmp_path, model, optim, 3, [1.0, 0.5], 2.0)
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["step"] == 3 and state["losses"] == [1.0, 0.5]
    torch.testing.assert_close(state["model"]["weight"], model.weight.detach(), atol=0, rtol=0)


# ---- shards stay in their folder -------------------------------------------------------------

def _checkpoint(tmp_path):
    from dllm_decode.models.checkpoint import save_checkpoint
    from dllm_decode.testing import tiny_llada

    model = tiny_llada()
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, model.config_dict() if hasattr(model, "config_dict") else _config(model), model)
    return folder


def _config(model):
    from dataclasses import asdict

    return {"model_type": "llada", **asdict(model.config)}


@pytest.mark.parametrize("escape", ["absolute", "dotdot", "symlink", "symlinked-single"])
def test_shards_are_confined_to_the_checkpoint_folder(tmp_path, escape):
    from dllm_decode.models.checkpoint import ModelLoadError, read_safetensors

    folder = _checkpoint(tmp_path)
    outside = tmp_path / "outside.safetensors"
    os.replace(folder / "model.safetensors", outside)
    if escape == "symlinked-single":
        os.symlink(outside, folder / "model.safetensors")
    else:
        name = {"absolute": str(outside), "dotdot": "../outside.safetensors", "symlink": "shard.safetensors"}[escape]
        if escape == "symlink":
            os.symlink(outside, folder / "shard.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": name}}))
    with pytest.raises(ModelLoadError, match="outside the checkpoint folder"):
        read_safetensors(folder)


def test_shards_inside_the_folder_still_load(tmp_path):
    from dllm_decode.models.checkpoint import read_safetensors
    from safetensors.torch import load_file

    folder = _checkpoint(tmp_path)
    (folder / "sub").mkdir()
    os.replace(folder / "model.safetensors", folder / "sub" / "a.safetensors")
    names = load_file(str(folder / "sub" / "a.safetensors"))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: "sub/a.safetensors" for k in names}}))
    assert set(read_safetensors(folder)) == set(names)


# ---- the HTTP limits ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def guarded(embedded):
    from dllm_decode.serve.app import background

    state = make_state(embedded, max_body_bytes=4096, body_timeout=0.5, max_depth=8)
    with background(state) as url:
        yield url, state


def _raw(url, payload: bytes, timeout=10.0) -> bytes:
    host, port = url.rsplit("//", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        try:
            conn.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):      # refused before the body was read
            pass
        data = b""
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
    return data


def _health_seconds(url) -> float:
    began = time.monotonic()
    with urllib.request.urlopen(url + "/health", timeout=5) as response:
        assert response.status == 200
    return time.monotonic() - began


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/health", "/nowhere"])
def test_a_body_over_the_limit_is_a_413_on_every_route(guarded, path):
    url, _ = guarded
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {50_000_000}\r\n\r\n").encode()
    answer = _raw(url, head + b'{"prompt": "' + b"a" * 1000)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"invalid_request_error" in answer


def test_a_chunked_body_over_the_limit_is_a_413_and_health_answers(guarded):
    url, _ = guarded
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"a" * 3000
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4)) + b"0\r\n\r\n"
    result = {}
    thread = threading.Thread(target=lambda: result.update(answer=_raw(url, head + body)))
    thread.start()
    assert _health_seconds(url) < 1.0
    thread.join(10)
    assert result["answer"].startswith(b"HTTP/1.1 413")


def test_a_body_that_stops_midway_is_a_408(guarded):
    url, _ = guarded
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"prompt\": ")
    began = time.monotonic()
    answer = _raw(url, head, timeout=10)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - began < 5
    assert _health_seconds(url) < 1.0


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/models"])
def test_nesting_over_the_limit_is_a_400_on_every_route(guarded, path):
    url, _ = guarded
    status, body = post(url, path, b"[" * 9 + b"]" * 9)
    assert status == 400 and "nested deeper than 8" in body["error"]["message"]
    status, body = post(url, path, {"prompt": "sort : bob", "dllm": {"scheduler": {"name": "credit", "base": {
        "name": "credit", "base": {"name": "credit", "base": {"name": "credit", "base": {
            "name": "credit", "base": {"name": "credit", "base": {"name": "credit", "base": {
                "name": "credit", "base": "threshold"}}}}}}}}}})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"


def test_health_answers_while_a_huge_prompt_is_refused_or_tokenised(embedded):
    from dllm_decode.serve.app import background

    with background(make_state(embedded)) as url:          # the default 1 MiB limit
        for size in (3_000_000, 100_000):                   # over the limit; under it (tokenised)
            body = json.dumps({"prompt": "bob " * size}).encode()
            head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            result = {}
            thread = threading.Thread(target=lambda: result.update(answer=_raw(url, head + body, 60)))
            thread.start()
            time.sleep(0.2)
            assert _health_seconds(url) < 1.0
            thread.join(60)
            expected = b"HTTP/1.1 413" if size == 3_000_000 else b"HTTP/1.1 400"
            assert result["answer"].startswith(expected), result["answer"][:300]


def test_limits_are_finite():
    from dllm_decode.serve.app import Limits

    for name in ("request_timeout", "shutdown_timeout", "body_timeout"):
        for value in (float("inf"), float("nan"), 0, -1, "5"):
            with pytest.raises(ValueError, match=name):
                Limits(**{name: value})


# ---- one check per input class at every entry point -----------------------------------------

@pytest.mark.parametrize("prompt, fragment", [("sort : bob <|mdm_mask|>", "special token"),
                                              ("copy : al <|endoftext|>", "special token"),
                                              ("sort : bob \ud800", "lone surrogate")])
def test_batch_lines_get_the_prompt_check(tmp_path, prompt, fragment):
    from click.testing import CliRunner

    from dllm_decode.cli import main

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"id": "x", "prompt": prompt}) + "\n")
    result = CliRunner().invoke(main, ["--model", "embedded", "--gen-length", "16", "--input", str(src),
                                       "--output", str(out)])
    assert result.exit_code == 2 and fragment in result.output and "request 'x'" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_prompt_gets_the_prompt_check_and_the_unknown_word_warning():
    from click.testing import CliRunner

    from dllm_decode.cli import main

    runner = CliRunner()
    bad = runner.invoke(main, ["--model", "embedded", "--gen-length", "16", "--prompt", "sort : <|mdm_mask|>"])
    assert bad.exit_code == 2 and "special token" in bad.output
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        good = runner.invoke(main, ["--model", "embedded", "--gen-length", "16", "--prompt", "The quick fox"])
    assert good.exit_code == 0
    assert any("does not know" in str(w.message) and "'quick'" in str(w.message) for w in caught)


def test_api_unknown_words_warn_and_token_ids_are_ints_only(embedded):
    from dllm_decode.prompts import UnknownWordsWarning, check_token_ids, encode_prompts

    with pytest.warns(UnknownWordsWarning, match="'quick'"):
        encode_prompts(["The quick fox"], embedded.tokenizer)
    for bad in ([5.7], ["5"], [True], [1, None], "5", 5, [[1]]):
        with pytest.raises(TypeError, match="integers|list of token ids"):
            check_token_ids(bad)
    with pytest.raises(ValueError, match=r"\[MASK\] id 3"):
        check_token_ids([5, 3], vocab_size=129, mask_id=3)
    assert check_token_ids(torch.tensor([1, 2])) == (1, 2)


def _llada_dir(tmp_path, **changes):
    from dllm_decode.models.checkpoint import resolve_model_dir

    source = resolve_model_dir("embedded")
    folder = tmp_path / "model"
    folder.mkdir()
    for item in source.iterdir():
        if item.is_file():
            (folder / item.name).write_bytes(item.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize("changes, fragment", [
    ({"mask_token_id": 5}, "mask_token_id 5"),          # a word, not the tokenizer's mask token
    ({"eos_token_id": 7}, "eos_token_id 7"),
])
def test_special_ids_must_agree_with_the_tokenizer(tmp_path, changes, fragment):
    from dllm_decode.models.checkpoint import ModelLoadError
    from dllm_decode.models.loading import load_model

    with pytest.raises(ModelLoadError, match=fragment):
        load_model(_llada_dir(tmp_path, **changes))


@pytest.mark.parametrize("changes, fragment", [
    ({"n_layers": 10_000_000}, "n_layers 10000000 is beyond any real model"),
    ({"d_model": 65536, "n_heads": 1, "n_kv_heads": 1, "mlp_hidden_size": 1 << 20, "n_layers": 1000},
     "GiB"),
])
def test_absurd_sizes_are_refused_before_anything_is_built(tmp_path, changes, fragment):
    from dllm_decode.models.checkpoint import ModelLoadError
    from dllm_decode.models.loading import load_model

    began = time.monotonic()
    with pytest.raises(ModelLoadError, match=fragment):
        load_model(_llada_dir(tmp_path, **changes))
    assert time.monotonic() - began < 5


def test_unknown_words_leave_the_chat_templates_markup_out(embedded):
    """A templated prompt's markup is the template's, not the user's words: the warning names
    only what the user typed that the tokenizer does not know."""
    import copy

    from dllm_decode.prompts import chat_prompt, unknown_words

    tokenizer = copy.deepcopy(embedded.tokenizer)
    tokenizer.chat_template = "<|turn|> {{ messages[0]['content'] }} <|answer|>"
    wrapped = chat_prompt(tokenizer, "sort : mia zebra")
    assert wrapped.startswith("<|turn|>")
    words = unknown_words(tokenizer, wrapped)
    assert "zebra" in words and not any("turn" in w or "answer" in w for w in words), words
