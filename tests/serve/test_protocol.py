"""Request bodies -> jobs, and the stop-string cutter, without a server."""

from __future__ import annotations

import pytest

from dllm_decode.config import DecodeConfig
from dllm_decode.registry import component
from dllm_decode.serve.protocol import APIError, Settings, StopText, chunk, parse_job
from dllm_decode.testing import tiny_tokenizer


@pytest.fixture(scope="module")
def settings():
    base = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": 0.8}),
                        gen_length=64, block_length=16)
    return Settings(model_id="m", config=base, max_tokens=256)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def job(settings, tok, kind="completion", **body):
    body.setdefault("prompt" if kind == "completion" else "messages",
                    "w1 w2" if kind == "completion" else [{"role": "user", "content": "w1 w2"}])
    return parse_job(kind, body, settings, tok)


def test_defaults_and_overrides(settings, tok):
    plain = job(settings, tok)
    assert plain.config == settings.config and plain.prompt == (1, 2) and plain.max_tokens is None
    changed = job(settings, tok, temperature=0.5, seed=3,
                  dllm={"scheduler": {"threshold": 0.6}, "cache": "prefix", "block_length": 8})
    assert changed.config.scheduler == component("scheduler", {"name": "threshold", "threshold": 0.6})
    assert changed.config.cache == component("cache", "prefix")
    assert (changed.config.temperature, changed.config.seed, changed.config.block_length) == (0.5, 3, 8)
    named = job(settings, tok, dllm={"scheduler": "low_confidence"})
    assert named.config.scheduler == component("scheduler", "low_confidence")


def test_max_tokens_rounds_the_canvas_up_to_whole_blocks(settings, tok):
    j = job(settings, tok, max_tokens=20)
    assert j.config.gen_length == 32 and j.max_tokens == 20
    assert job(settings, tok, max_tokens=20, dllm={"gen_length": 48}).config.gen_length == 48
    chat = job(settings, tok, "chat", max_completion_tokens=5)
    assert chat.max_tokens == 5 and chat.config.gen_length == 16


@pytest.mark.parametrize("body, status, param", [
    ({"dllm": {"scheduler": "nope"}}, 400, "dllm.scheduler"),
    ({"dllm": {"scheduler": {"threshold": 2.0}}}, 400, "dllm.scheduler"),
    ({"dllm": {"cache": {"name": "dual", "nope": 1}}}, 400, "dllm.cache"),
    ({"dllm": {"filters": "eotp"}}, 400, "dllm.filters"),
    ({"dllm": {"block_length": 7}}, 400, "dllm.block_length"),
    ({"dllm": {"gen_length": 512}}, 400, "dllm.gen_length"),
    ({"dllm": {"steps": 3}}, 400, "dllm.steps"),
    ({"dllm": []}, 400, "dllm"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 1000}, 400, "max_tokens"),
    ({"temperature": "hot"}, 400, "temperature"),
    ({"seed": -1}, 400, "seed"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": ["w1", "w2"]}, 400, "prompt"),
    ({"prompt": 3}, 400, "prompt"),
    ({"n": 2}, 400, "n"),
    ({"logprobs": 2}, 400, "logprobs"),
    ({"top_p": 0.5}, 400, "top_p"),
    ({"stream": "yes"}, 400, "stream"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"messages": []}, 400, "unrecognized"),
    ({"model": "other"}, 404, "model"),
])
def test_bad_completion_bodies(settings, tok, body, status, param):
    with pytest.raises(APIError) as err:
        job(settings, tok, **body)
    assert err.value.status == status
    assert err.value.param == param or param in err.value.message
    assert set(err.value.body()["error"]) == {"message", "type", "param", "code"}


def test_chat_messages(settings, tok):
    assert job(settings, tok, "chat", messages=[{"role": "user", "content": [
        {"type": "text", "text": "w3 "}, {"type": "text", "text": "w4"}]}]).prompt == (3, 4)
    for messages in ([], [{"role": "robot", "content": "w1"}], [{"role": "user", "content": 3}],
                     [{"role": "system", "content": "w1"}, {"role": "user", "content": "w2"}]):
        with pytest.raises(APIError) as err:
            job(settings, tok, "chat", messages=messages)
        assert err.value.status == 400 and err.value.param.startswith("messages")


def test_chat_template_renders_every_message(settings):
    from transformers import PreTrainedTokenizerFast

    tok = tiny_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}w9"
    j = parse_job("chat", {"messages": [{"role": "system", "content": "w1"},
                                        {"role": "user", "content": "w2"}]}, settings, tok)
    assert j.prompt == (1, 2, 9)


def test_stop_text_holds_back_a_possible_stop_and_cuts_at_it():
    cut = StopText(("END", "xy"))
    assert cut.feed("ab E") == "ab "          # "E" may begin "END"
    assert cut.feed("Nd ") == "ENd "
    assert cut.feed("qq EN") == "qq "
    assert cut.feed("D tail") == "" and cut.hit and cut.text == "ab ENd qq "
    assert cut.feed("more") == "" and cut.flush() == ""
    free = StopText(("zz",))
    assert free.feed("abz") == "ab" and free.flush() == "z" and not free.hit


def test_chunks_follow_openai_shapes(settings, tok):
    j = job(settings, tok, "chat", stream=True, stream_options={"include_usage": True})
    first = chunk(j, "m", text="", role=True)
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"] == {
        "role": "assistant", "content": ""} and first["usage"] is None
    last = chunk(j, "m", finish_reason="stop")
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"
    assert isinstance(first["created"], int) and first["id"] == last["id"] == j.id
