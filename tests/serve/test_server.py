"""A live server on 127.0.0.1 through the `openai` client and raw HTTP: answers equal offline
`generate`, streams reassemble to the same text, errors are OpenAI JSON and the server survives."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from dllm_decode.registry import component  # noqa: E402
from dllm_decode.sampler import generate  # noqa: E402
from tests.serve.conftest import (Slow, default_config, make_state, post, sse,  # noqa: E402
                                  wait_until)

SORT = "sort : mia ella hank"


def client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def offline(model, prompt: str, config) -> str:
    ids = model.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return generate(model, [ids], config).text[0]


def test_models_and_health(server):
    url, _ = server
    assert [m.id for m in client(url).models.list().data] == ["embedded"]
    with urllib.request.urlopen(url + "/health") as response:
        body = json.loads(response.read())
    assert body["status"] == "ok" and body["tensor_parallel"] == 1


def test_completion_equals_offline_generate(server, embedded):
    url, _ = server
    reply = client(url).completions.create(
        model="embedded", prompt=SORT, max_tokens=16,
        extra_body={"dllm": {"scheduler": {"name": "low_confidence"}, "block_length": 8}})
    choice = reply.choices[0]
    config = default_config(gen_length=16, block_length=8, scheduler=component("scheduler", "low_confidence"))
    assert choice.text == offline(embedded, SORT, config) == "ella hank mia"
    assert choice.finish_reason == "stop" and reply.object == "text_completion"
    assert reply.usage.completion_tokens == 3 and reply.usage.prompt_tokens == 5
    assert reply.model_extra["dllm"]["config"]["scheduler"]["name"] == "low_confidence"


def test_chat_streamed_reassembles_to_the_non_streamed_text(server, embedded):
    url, _ = server
    messages = [{"role": "user", "content": "copy : tom ann bob sue"}]
    api = client(url)
    whole = api.chat.completions.create(model="embedded", messages=messages)
    parts = [c for c in api.chat.completions.create(model="embedded", messages=messages, stream=True,
                                                    stream_options={"include_usage": True})]
    text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert text == whole.choices[0].message.content == offline(embedded, messages[0]["content"],
                                                               default_config())
    assert parts[0].choices[0].delta.role == "assistant"
    assert parts[-2].choices[0].finish_reason == "stop" and parts[-1].choices == []
    assert parts[-1].usage.completion_tokens == whole.usage.completion_tokens == len(text.split())
    assert len({c.id for c in parts}) == 1 and len({c.created for c in parts}) == 1


def test_raw_stream_is_openai_sse(server):
    url, _ = server
    events = sse(url, "/v1/completions", {"model": "embedded", "prompt": SORT, "stream": True,
                                          "dllm": {"scheduler": "low_confidence", "block_length": 4}})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" and isinstance(c["created"], int) for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "ella hank mia"
    assert len(chunks) >= 3                    # low_confidence: one token a step, streamed as final
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_stop_strings_cut_the_answer(server):
    url, _ = server
    status, body = post(url, "/v1/completions", {"model": "embedded", "prompt": SORT, "stop": " mia"})
    assert status == 200 and body["choices"][0] == {"index": 0, "text": "ella hank", "logprobs": None,
                                                    "finish_reason": "stop"}
    events = sse(url, "/v1/completions", {"model": "embedded", "prompt": SORT, "stop": ["hank"],
                                          "stream": True})
    assert "".join(c["choices"][0]["text"] for c in events[:-1]) == "ella "


BAD = [
    (b'{"model": "embedded", "prompt": "sort : mia", "dllm": {"scheduler": "nope"}}', 400),
    (b'{"model": "embedded", "prompt": "sort : mia", "dllm": {"scheduler": {"threshold": 1.5}}}', 400),
    (b'{"model": "embedded", "prompt": "sort : mia", "temperature": 500}', 400),
    (b'{"model": "embedded", "prompt": "   "}', 400),
    (json.dumps({"model": "embedded", "prompt": "mia " * 1000}).encode(), 400),
    (b'{"model": "embedded", "prompt": "sort : mia", "max_tokens": 100000}', 400),
    (b'{"model": "embedded", "prompt": "sort : mia"', 400),
    (b'\xff\xfe', 400),
    (b'{"model": "gpt-4", "prompt": "sort : mia"}', 404),
]


@pytest.mark.parametrize("raw, status", BAD)
def test_bad_requests_get_a_json_error_and_the_server_keeps_serving(server, raw, status):
    url, state = server
    got, body = post(url, "/v1/completions", raw)
    assert got == status
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    ok, reply = post(url, "/v1/completions", {"model": "embedded", "prompt": SORT})
    assert ok == 200 and reply["choices"][0]["text"] == "ella hank mia"
    assert state.in_flight == 0


def test_the_sdk_raises_typed_errors(server):
    url, _ = server
    with pytest.raises(openai.BadRequestError, match="unknown scheduler"):
        client(url).chat.completions.create(model="embedded", messages=[{"role": "user", "content": "x"}],
                                            extra_body={"dllm": {"scheduler": "nope"}})
    with pytest.raises(openai.NotFoundError):
        client(url).completions.create(model="other", prompt=SORT)


def test_unknown_route_is_a_json_404(server):
    url, _ = server
    status, body = post(url, "/v1/embeddings", {"input": "x"})
    assert status == 404 and body["error"]["type"] == "not_found_error"


def _slow_server(embedded, delay=0.05, **kwargs):
    from dllm_decode.serve.app import background

    state = make_state(Slow(embedded, delay), **kwargs)
    return state, background(state)


LONG = {"model": "embedded", "prompt": "copy : tom ann bob sue",
        "dllm": {"scheduler": "low_confidence", "gen_length": 32, "block_length": 32}}
"""32 forwards of one token each: 1.6 s behind `Slow`."""


def test_a_full_queue_gets_429(embedded):
    state, running = _slow_server(embedded, max_batch_size=1, max_queue=0)
    with running as url:
        results = []
        first = threading.Thread(target=lambda: results.append(post(url, "/v1/completions", LONG)))
        first.start()
        assert wait_until(lambda: state.in_flight == 1)
        status, body = post(url, "/v1/completions", LONG)
        assert status == 429 and body["error"]["code"] == "queue_full"
        first.join()
        assert results[0][0] == 200


def test_a_timeout_gets_504_and_frees_the_row(embedded):
    state, running = _slow_server(embedded, request_timeout=0.3)
    with running as url:
        status, body = post(url, "/v1/completions", LONG)
        assert status == 504 and body["error"]["type"] == "timeout_error"
        assert wait_until(lambda: not state.worker.engine.has_work and state.in_flight == 0)
        events = sse(url, "/v1/completions", {**LONG, "stream": True})
        assert "error" in events[-2] and events[-1] == "[DONE]"
        with pytest.raises(openai.APIError, match="longer than"):      # a mid-stream error
            list(client(url).completions.create(model="embedded", prompt=LONG["prompt"], stream=True,
                                                extra_body={"dllm": LONG["dllm"]}))


def test_a_client_disconnect_frees_its_row(embedded):
    """The client hangs up while its 96-step decode runs: the request is cancelled early."""
    import http.client
    import urllib.parse

    state, running = _slow_server(embedded)
    with running as url:
        longer = {**LONG, "stream": True, "dllm": {**LONG["dllm"], "gen_length": 96, "block_length": 96}}
        where = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
        connection.request("POST", "/v1/completions", json.dumps(longer), {"Content-Type": "application/json"})
        assert wait_until(lambda: state.worker.engine.steps > 2)          # it is decoding
        connection.close()
        assert wait_until(lambda: not state.worker.engine.has_work and state.in_flight == 0)
        assert not state.worker.engine.lives and state.worker.engine.steps < 96   # cut short


def _shut_down_during_a_request(embedded, **kwargs):
    """Leave the server's block (a shutdown, as on SIGTERM) while LONG runs; its reply and state."""
    state, running = _slow_server(embedded, **kwargs)
    results = []
    with running as url:
        worker = threading.Thread(target=lambda: results.append(post(url, "/v1/completions", LONG)))
        worker.start()
        assert wait_until(lambda: state.worker.engine.lives)
    worker.join()
    assert not state.worker.thread.is_alive()
    return results[0]


def test_shutdown_finishes_in_flight_requests(embedded):
    status, body = _shut_down_during_a_request(embedded, shutdown_timeout=20)
    assert status == 200 and body["choices"][0]["finish_reason"] == "stop"


def test_shutdown_cancels_what_outlives_the_grace_period(embedded):
    status, body = _shut_down_during_a_request(embedded, delay=0.2, shutdown_timeout=0.3)
    assert status == 503 and body["error"]["code"] == "shutting_down"


def test_draining_refuses_new_requests(embedded):
    state, running = _slow_server(embedded)
    with running as url:
        state.draining = True
        status, body = post(url, "/v1/completions", LONG)
        assert status == 503 and body["error"]["code"] == "shutting_down"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url + "/health")
        assert err.value.code == 503 and json.loads(err.value.read())["status"] == "draining"


@pytest.mark.slow
def test_a_causal_lm_is_served_the_same_way():
    from dllm_decode.engine import Engine, SpeculativeModel
    from dllm_decode.serve.app import Limits, ServerState, background
    from dllm_decode.serve.protocol import Settings
    from dllm_decode.serve.worker import EngineWorker
    from dllm_decode.speculative import LookupDrafter, SpecConfig, speculative_generate
    from dllm_decode.models.causal import load_causal_lm

    target = load_causal_lm("ar_target")
    config = default_config(gen_length=16, block_length=16)
    settings = Settings(model_id="embedded", config=config, scheduler_kinds=("scheduler", "draft_length"))
    state = ServerState(EngineWorker(Engine(SpeculativeModel(target, LookupDrafter()))), settings, Limits())
    prompt = "sort : mia ella ="
    with background(state) as url:
        api = client(url)
        text = api.completions.create(model="embedded", prompt=prompt).choices[0].text
        streamed = "".join(c.choices[0].text for c in api.completions.create(
            model="embedded", prompt=prompt, stream=True))
        heuristic = api.completions.create(model="embedded", prompt=prompt,
                                           extra_body={"dllm": {"scheduler": "heuristic"}})
    alone = speculative_generate(target, prompt, SpecConfig(scheduler=config.scheduler, max_new_tokens=16),
                                 LookupDrafter())
    assert text == streamed == alone.text.strip() == heuristic.choices[0].text


def test_replies_do_not_wait_for_a_delayed_ack(server):
    """The server's own per-request cost: with Nagle's algorithm on, a reply written in two parts (headers, body) waits for the
    client's delayed ACK: >= 40 ms on Linux, every time. The fastest of 10 keep-alive probes
    shows it whatever the machine's load (measured here: 0.6 ms with TCP_NODELAY, 43 ms without)."""
    url, _ = server
    target = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
    times = []
    for _ in range(10):                   # a completion between probes, as a client would send
        connection.request("POST", "/v1/completions", '{"prompt": "sort: 1 2", "max_tokens": 4}',
                           {"Content-Type": "application/json"})
        connection.getresponse().read()
        started = time.perf_counter()
        connection.request("GET", "/health")
        connection.getresponse().read()
        times.append(time.perf_counter() - started)
    connection.close()
    assert min(times) < 0.02, times
