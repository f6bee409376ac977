"""What an operator sees: `/openapi.json`, `/metrics`, an access line per request, a 405 typed as
an invalid request, usage that counts only the returned tokens, one prompt check, and settings
that cannot run refused at start-up."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request

import pytest
import torch
from click.testing import CliRunner

from tests.serve.conftest import post, wait_until


def get(url: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url + path, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_openapi_describes_the_routes(server):
    url, _ = server
    status, text = get(url, "/openapi.json")
    document = json.loads(text)
    assert status == 200 and {"/v1/completions", "/v1/chat/completions", "/health"} <= set(document["paths"])
    schemas = document["components"]["schemas"]
    assert {"CompletionRequest", "ChatCompletionRequest", "CompletionResponse", "ErrorResponse"} <= set(schemas)
    body = document["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"].endswith("/CompletionRequest")


def test_the_schema_and_the_validator_accept_the_same_keys():
    """The pydantic models validate the shapes and document them: one list of keys."""
    from dllm_decode.serve import schema
    from dllm_decode.serve.protocol import DLLM_KEYS, KEYS, UNSUPPORTED

    assert set(schema.CompletionRequest.model_fields) == KEYS["completion"]
    assert set(schema.ChatCompletionRequest.model_fields) == KEYS["chat"]
    assert set(schema.DllmOptions.model_fields) == set(DLLM_KEYS)
    assert set(UNSUPPORTED) <= KEYS["completion"] | KEYS["chat"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_get_on_a_post_route_is_an_invalid_request(server, path):
    url, _ = server
    status, text = get(url, path)
    error = json.loads(text)["error"]
    assert status == 405 and error["type"] == "invalid_request_error" and "POST" in error["message"]


def test_metrics_count_requests_tokens_and_nfe(server):
    url, _ = server
    status, body = post(url, "/v1/completions", {"prompt": "sort : mia ella hank"})
    assert status == 200
    status, text = get(url, "/metrics")
    assert status == 200
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values['dllm_requests_total{path="/v1/completions",status="200"}'] >= 1
    assert values["dllm_completion_tokens_total"] >= body["usage"]["completion_tokens"]
    assert values["dllm_nfe_total"] >= body["dllm"]["nfe"] > 0
    assert values["dllm_prompt_tokens_total"] >= body["usage"]["prompt_tokens"]
    assert "dllm_requests_in_flight" in values and "dllm_queue_depth" in values
    assert values['dllm_decode_seconds_bucket{le="+Inf"}'] == values["dllm_decode_seconds_count"] >= 1
    assert "# TYPE dllm_request_seconds histogram" in text


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_one_access_line_per_request_at_info(server):
    """A handler on the access logger itself: the server's log config stops `dllm_decode`'s
    records at its own handler (propagate off), so the root logger (caplog's) never sees them."""
    url, _ = server
    access = logging.getLogger("dllm_decode.serve.access")
    seen, level = _Records(), access.level

    def lines(route):
        return [r.getMessage() for r in seen.records if f'"GET {route}"' in r.getMessage()]

    access.addHandler(seen)
    access.setLevel(logging.INFO)
    try:
        get(url, "/health")
        get(url, "/v1/models")
        assert wait_until(lambda: lines("/health") and lines("/v1/models"), 30)   # logged once sent
        time.sleep(0.1)
    finally:
        access.removeHandler(seen)
        access.setLevel(level)
    assert len(lines("/health")) == 1 and " 200 " in lines("/health")[0]
    assert len(lines("/v1/models")) == 1


def test_usage_counts_only_the_tokens_returned_after_a_stop(server):
    url, state = server
    tokenizer = state.tokenizer
    prompt = {"prompt": "sort : mia ella hank", "dllm": {"gen_length": 16}}
    status, full = post(url, "/v1/completions", prompt)
    words = full["choices"][0]["text"].split()
    assert status == 200 and len(words) >= 2
    status, cut = post(url, "/v1/completions", {**prompt, "stop": [" " + words[1]]})
    text = cut["choices"][0]["text"]
    assert status == 200 and cut["choices"][0]["finish_reason"] == "stop" and text == words[0]
    assert cut["usage"]["completion_tokens"] == len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert cut["usage"]["completion_tokens"] < full["usage"]["completion_tokens"]


# ---- the one prompt check ---------------------------------------------------------------------

@pytest.mark.parametrize("body, param", [
    ({"prompt": "sort : bob <|mdm_mask|> amy"}, "prompt"),
    ({"prompt": "copy : al <|endoftext|>"}, "prompt"),
    ({"messages": [{"role": "user", "content": "sort : [PAD] bob"}]}, "messages[0].content"),
    ({"prompt": [5, 3]}, "prompt"),                          # the [MASK] id
    ({"prompt": [5, True]}, "prompt"),
])
def test_special_tokens_in_a_prompt_are_a_400(server, body, param):
    url, _ = server
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    status, reply = post(url, path, body)
    assert status == 400 and reply["error"]["param"] == param, reply


def test_a_lone_surrogate_is_a_400(server):
    url, _ = server
    status, reply = post(url, "/v1/completions", b'{"prompt": "sort : bob \\ud800 amy"}')
    assert status == 400 and "surrogate" in reply["error"]["message"]


def test_unknown_words_come_back_as_a_warning(server):
    url, _ = server
    status, reply = post(url, "/v1/completions", {"prompt": "The quick brown fox"})
    assert status == 200 and "'quick'" in reply["warning"] and "[UNK]" in reply["warning"]
    status, reply = post(url, "/v1/completions", {"prompt": "sort : mia ella"})
    assert status == 200 and "warning" not in reply


# ---- settings that cannot run are refused at start-up -----------------------------------------

@pytest.mark.parametrize("args, fragment", [
    (["--shutdown-timeout", "inf"], "not a finite number"),
    (["--request-timeout", "inf"], "not a finite number"),
    (["--body-timeout", "nan"], "not a number"),
    (["--model", "ar:ar_target", "--cache", "prefix"], "does not apply to `ar:` models"),
])
def test_serve_refuses_settings_that_cannot_run(args, fragment):
    from dllm_decode.cli import main

    result = CliRunner().invoke(main, ["serve", "--port", "0", *args])
    assert result.exit_code == 2 and fragment in result.output, result.output
    assert "Traceback" not in result.output


class Broken(torch.nn.Module):
    """A model whose forward fails the way an impossible model/policy pair does."""

    def __init__(self, model):
        super().__init__()
        for name in ("mask_token_id", "eos_token_ids", "vocab_size", "max_length", "tokenizer"):
            setattr(self, name, getattr(model, name))

    def forward(self, *args, **kwargs):
        raise ValueError("this model cannot run this policy")


def test_the_start_up_check_runs_the_default_record(embedded):
    from dllm_decode.engine import Engine
    from dllm_decode.serve.worker import startup_check
    from tests.serve.conftest import default_config

    assert startup_check(Engine(embedded, max_batch_size=2), default_config()) is None
    broken = Engine(Broken(embedded), max_batch_size=2)
    assert "cannot run this policy" in startup_check(broken, default_config())
    assert not broken.has_work
