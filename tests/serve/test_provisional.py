"""Provisional streaming: `"dllm": {"stream_mode": "provisional"}` sends the canvas after every
step beside the committed text; the default stream is unchanged."""

from __future__ import annotations

import pytest

from tests.serve.conftest import post, sse

PROMPT = "sort: 3 1 2 4"
CHAT = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16, "stream": True,
        "dllm": {"gen_length": 16, "block_length": 8}}


def provisional(body: dict) -> dict:
    return {**body, "dllm": {**body["dllm"], "stream_mode": "provisional"}}


def test_provisional_chunks_carry_the_canvas(server):
    url, _ = server
    events = sse(url, "/v1/chat/completions", provisional(CHAT))
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if "dllm" in e]
    assert len(chunks) >= 2
    deltas, steps = "", []
    for body in chunks:
        assert body["object"] == "chat.completion.chunk"
        deltas += body["choices"][0]["delta"].get("content", "")
        draft = body["dllm"]
        assert draft["kind"] == "provisional"
        assert len(draft["tokens"]) == len(draft["state"]) == 16
        assert set(draft["state"]) <= {"committed", "provisional", "masked"}
        for token, state in zip(draft["tokens"], draft["state"]):
            assert (token is None) == (state == "masked")
        assert draft["committed_text"] == deltas
        steps.append((draft["step"], draft["nfe"]))
    assert [s for s, _ in steps] == list(range(1, len(steps) + 1))
    assert all(a <= b for (_, a), (_, b) in zip(steps, steps[1:]))
    assert any("provisional" in body["dllm"]["state"] for body in chunks)
    assert set(chunks[-1]["dllm"]["state"]) == {"committed"}            # the final canvas
    committed = sse(url, "/v1/chat/completions", CHAT)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in committed[:-1] if e["choices"])
    assert deltas == text and text
    assert not any("dllm" in e for e in committed[:-1])                # the default is unchanged
    assert events[-2]["choices"][0]["finish_reason"] is not None


def test_provisional_positions_lie_in_the_active_block(embedded):
    from dllm_decode.engine import Engine, Request
    from tests.serve.conftest import default_config

    engine = Engine(embedded, max_batch_size=2)
    prompt = tuple(embedded.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    from dllm_decode.registry import component

    config = default_config(gen_length=16, block_length=4, scheduler=component("scheduler", "low_confidence"))
    engine.add(Request("p", prompt, config, provisional=True))
    engine.add(Request("c", prompt, config))
    drafts, texts = [], {}
    while engine.has_work:
        for update in engine.step():
            if update.request_id == "p" and update.draft is not None:
                drafts.append(update.draft)
            if update.output is not None:
                texts[update.request_id] = update.output.text
    assert texts["p"] == texts["c"]                                    # watching changes nothing
    for draft in drafts[:-1]:
        columns = [i for i, s in enumerate(draft.state) if s == "provisional"]
        if columns:                                                    # one block of 4 at a time
            assert max(columns) // 4 == min(columns) // 4
    assert any("provisional" in d.state for d in drafts)


@pytest.mark.parametrize("body, param", [
    ({"prompt": PROMPT, "dllm": {"stream_mode": "provisional"}}, "dllm.stream_mode"),
    ({"prompt": PROMPT, "stream": True, "dllm": {"stream_mode": "denoise"}}, "dllm.stream_mode"),
])
def test_bad_stream_modes(server, body, param):
    url, _ = server
    status, reply = post(url, "/v1/completions", body)
    assert status == 400 and reply["error"]["param"] == param


def test_the_stream_mode_travels_to_tensor_parallel_followers():
    from dllm_decode.engine import Request
    from dllm_decode.serve.worker import request_from_record, request_record
    from tests.serve.conftest import default_config

    request = Request("r", (1, 2, 3), default_config(), max_tokens=5, provisional=True, adapter="a")
    assert request_from_record(request_record(request)) == request


@pytest.mark.parametrize("family", ["embedded", "embedded-bd"])       # masked, block diffusion
def test_drafts_equal_the_trace_frames(embedded, family):
    """Every step's draft shows the cells `generate(..., trace=True)`'s frames show: the same
    committed and provisional tokens, masked elsewhere (a column the step could not commit,
    such as the rest of a block at a block-diffusion block's first step, is masked in both)."""
    import torch

    from dllm_decode.engine import Engine, Request
    from dllm_decode.modelspec import ModelSpec, load_diffusion
    from dllm_decode.sampler import generate
    from dllm_decode.viz.frames import result_frames
    from tests.serve.conftest import default_config

    model = embedded if family == "embedded" else load_diffusion(ModelSpec.parse(family))
    prompt = list(model.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    config = default_config(gen_length=16)
    engine = Engine(model, max_batch_size=1)
    engine.add(Request("p", tuple(prompt), config, provisional=True))
    drafts = []
    while engine.has_work:
        drafts += [u.draft for u in engine.step() if u.draft is not None]
    result = generate(model, [prompt], config, tokenizer=model.tokenizer, trace=True,
                      generator=torch.Generator().manual_seed(config.seed))
    frames = result_frames(result)[0].frames
    label = {t: model.tokenizer.batch_decode([[t]])[0] for f in frames for t in f.tokens if t is not None}
    assert [(d.step, list(d.state), list(d.tokens)) for d in drafts] == \
        [(f.step, list(f.state), [None if t is None else label[t] for t in f.tokens]) for f in frames]
    assert any("provisional" in d.state for d in drafts)
