"""The server behind a load balancer: the extension fields vllm-router and sglang-router add to
every body are accepted at the values they send, refused at values the server cannot honour, and
the probes they make are answered."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.serve.conftest import post

# What the routers add (vllm-router 0.1.17, sglang-router 0.3.2, observed on a logging server).
COMPLETION_FIELDS = {"stream": False, "echo": False, "no_stop_trim": False, "ignore_eos": False,
                     "skip_special_tokens": True, "return_hidden_states": False}
CHAT_FIELDS = {**{k: v for k, v in COMPLETION_FIELDS.items() if k != "echo"}, "logprobs": False,
               "continue_final_message": False, "separate_reasoning": True, "stream_reasoning": True,
               "include_reasoning": True}


def test_routed_completion_equals_plain(server):
    url, _ = server
    plain = {"prompt": "sort: 3 1 2", "max_tokens": 16}
    status, direct = post(url, "/v1/completions", plain)
    assert status == 200
    status, routed = post(url, "/v1/completions", {**plain, **COMPLETION_FIELDS})
    assert status == 200, routed
    assert routed["choices"][0]["text"] == direct["choices"][0]["text"]


def test_routed_chat_equals_plain(server):
    url, _ = server
    plain = {"messages": [{"role": "user", "content": "sort: 3 1 2"}], "max_tokens": 16}
    status, direct = post(url, "/v1/chat/completions", plain)
    status, routed = post(url, "/v1/chat/completions", {**plain, **CHAT_FIELDS})
    assert status == 200, routed
    assert routed["choices"][0]["message"] == direct["choices"][0]["message"]


@pytest.mark.parametrize("path, field, value", [
    ("/v1/completions", "ignore_eos", True),
    ("/v1/completions", "skip_special_tokens", False),
    ("/v1/completions", "return_hidden_states", True),
    ("/v1/completions", "no_stop_trim", "no"),
    ("/v1/chat/completions", "continue_final_message", True),
])
def test_values_not_honoured_are_refused(server, path, field, value):
    url, _ = server
    body = {"prompt": "sort: 3 1 2"} if path == "/v1/completions" else \
        {"messages": [{"role": "user", "content": "sort: 3 1 2"}]}
    status, reply = post(url, path, {**body, field: value})
    assert status == 400
    assert reply["error"]["param"] == field and "accepted:" in reply["error"]["message"]


def test_chat_only_fields_are_refused_on_completions(server):
    url, _ = server
    status, reply = post(url, "/v1/completions", {"prompt": "x", "separate_reasoning": True})
    assert status == 400 and reply["error"]["param"] == "separate_reasoning"


def test_probes(server, embedded):
    url, _ = server
    with urllib.request.urlopen(url + "/get_model_info", timeout=30) as response:
        info = json.loads(response.read())
    assert info["model_path"] == "embedded" and info["is_generation"] is True
    with urllib.request.urlopen(url + "/get_server_info", timeout=30) as response:
        assert "in_flight" in json.loads(response.read())
    status, tokens = post(url, "/tokenize", {"prompt": "sort: 3 1 2"})
    assert status == 200
    assert tokens["tokens"] == embedded.tokenizer("sort: 3 1 2", add_special_tokens=False)["input_ids"]
    assert tokens["count"] == len(tokens["tokens"])
    status, bad = post(url, "/tokenize", {"text": 3})
    assert status == 400 and "prompt" in bad["error"]["message"]


def test_openapi_documents_router_fields(server):
    url, _ = server
    with urllib.request.urlopen(url + "/openapi.json", timeout=30) as response:
        document = json.loads(response.read())
    chat = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"ignore_eos", "separate_reasoning"} <= set(chat)
    assert "/tokenize" in document["paths"] and "/get_model_info" in document["paths"]
