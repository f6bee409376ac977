"""The server on a uniform-noise model (the tiny DiffusionGemma checkpoint): answers equal offline
`generate` with the same seed, the committed stream grows by whole canvases, provisional chunks
carry the current argmax canvas, and requests decoded side by side equal each decoded alone."""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers.models.diffusion_gemma")

from dllm_decode.config import DecodeConfig  # noqa: E402
from dllm_decode.registry import component  # noqa: E402
from dllm_decode.sampler import generate  # noqa: E402
from tests.serve.conftest import make_state, post, sse  # noqa: E402

CANVAS, GEN = 8, 16
PROMPTS = ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9 w10"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    from dllm_decode.models.loading import load_model
    from dllm_decode.testing import tiny_tokenizer
    from tests.models.gemma_reference import write_reference

    directory = tmp_path_factory.mktemp("gemma")
    write_reference(directory)
    tiny_tokenizer().save_pretrained(str(directory))
    (directory / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": 35, "pad_token_id": 35, "max_denoising_steps": 4}))
    return load_model(directory)


def config() -> DecodeConfig:
    return DecodeConfig(component("scheduler", {"name": "uniform_noise", "steps": 4}), gen_length=GEN, block_length=CANVAS)


@pytest.fixture(scope="module")
def server(gemma):
    from dllm_decode.serve.app import background

    with background(make_state(gemma, config=config())) as url:
        yield url


def offline(model, prompt: str) -> str:
    ids = model.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return generate(model, [ids], config()).text[0]


def complete(url: str, prompt: str, **extra) -> dict:
    status, body = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": GEN, **extra})
    assert status == 200, body
    return body


def test_a_completion_equals_offline_generate(server, gemma):
    body = complete(server, PROMPTS[0])
    text = body["choices"][0]["text"]
    assert text == offline(gemma, PROMPTS[0]) and text
    assert body["dllm"]["config"]["scheduler"]["name"] == "uniform_noise"


def test_a_masked_rule_that_does_not_run_on_noise_is_a_400(server):
    status, body = post(server, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": GEN,
                                                    "dllm": {"scheduler": {"name": "wino"}}})
    assert status == 400 and "does not run on a noise canvas" in json.dumps(body)


def test_the_committed_stream_grows_by_whole_canvases(server, gemma):
    events = sse(server, "/v1/completions", {"prompt": PROMPTS[1], "max_tokens": GEN, "stream": True})
    assert events[-1] == "[DONE]"
    parts = [e["choices"][0]["text"] for e in events[:-1] if e["choices"] and e["choices"][0]["text"]]
    assert "".join(parts) == offline(gemma, PROMPTS[1])
    assert 1 <= len(parts) <= GEN // CANVAS            # one delta per committed canvas at most


def test_provisional_chunks_carry_the_current_canvas(server):
    events = sse(server, "/v1/completions", {"prompt": PROMPTS[2], "max_tokens": GEN, "stream": True,
                                             "dllm": {"stream_mode": "provisional"}})
    drafts = [e["dllm"] for e in events[:-1] if isinstance(e, dict) and "dllm" in e]
    assert len(drafts) >= 2
    for draft in drafts:
        assert len(draft["state"]) == GEN
        open_columns = [i for i, s in enumerate(draft["state"]) if s == "provisional"]
        if open_columns:                           # the canvas denoising now: one whole canvas
            assert len(open_columns) == CANVAS and open_columns[0] % CANVAS == 0
            assert all(draft["tokens"][i] is not None for i in open_columns)
    assert any("provisional" in d["state"] for d in drafts)
    assert set(drafts[-1]["state"]) == {"committed"}


def test_requests_side_by_side_equal_each_alone(server, gemma):
    texts: dict[int, str] = {}

    def ask(i: int) -> None:
        texts[i] = complete(server, PROMPTS[i])["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [texts[i] for i in range(len(PROMPTS))] == [offline(gemma, p) for p in PROMPTS]


def test_a_refusal_names_the_served_model_not_its_folder(gemma):
    """A model-side message names the model by the folder it was loaded from; the reply shows
    the served model id instead (asked for a stream too: refused before it starts)."""
    from dllm_decode.serve.app import background

    folder = gemma.name_or_path
    assert "/" in folder
    with background(make_state(gemma, config=config())) as url:
        status, body = post(url, "/v1/completions", {"prompt": "w1 w2", "dllm": {"cache": "block"}})
        streamed = post(url, "/v1/completions", {"prompt": "w1 w2", "stream": True, "dllm": {"cache": "block"}})
    assert status == 400 and "embedded" in body["error"]["message"], body
    assert streamed[0] == 400 and folder not in json.dumps(body) + json.dumps(streamed[1])
