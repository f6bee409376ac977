"""The HTML trace, the playground and the terminal animation as a person sees them: a real
headless Chromium (the system's package; skipped when absent) and a real pseudo-terminal.

`DLLM_SCREENSHOTS=docs/assets python -m pytest -m slow tests/viz/test_browser.py` refreshes the
docs' screenshots."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.browser import Browser, chromium

try:                                 # module level: FastAPI reads the stand-in route's annotation
    from fastapi import Request
except ImportError:                  # the test that needs it skips
    Request = None

from .conftest import PROMPTS, read_screen

pytestmark = pytest.mark.slow
needs_chromium = pytest.mark.skipif(chromium() is None, reason="no chromium (apt-get install chromium)")


def _shot(browser: Browser, tmp_path: Path, name: str) -> Path:
    where = Path(os.environ.get("DLLM_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    browser.screenshot(where / name)
    assert (where / name).stat().st_size > 5000          # a picture, not a blank
    return where / name


@needs_chromium
def test_trace_page_replays_the_decode(traced, tmp_path):
    from dllm_decode.viz.frames import result_frames

    result, tokenizer = traced
    page = tmp_path / "trace.html"
    page.write_text(result.to_html(tokenizer, PROMPTS))
    samples = result_frames(result)
    with Browser() as browser:
        browser.open(page.as_uri())
        width = result.tokens.shape[1]
        assert browser.evaluate("document.querySelectorAll('.sample').length") == len(PROMPTS)
        assert browser.evaluate("document.querySelectorAll('.cell[data-pos]').length") == width * len(PROMPTS)
        for k in range(1, max(s.steps for s in samples) + 1):
            browser.evaluate(f"dllmTrace.render({k})")
            shown = browser.evaluate("Array.from(document.querySelectorAll('.sample')).map(s => "
                                     "Array.from(s.querySelectorAll('.cell[data-pos]')).map(c => "
                                     "[c.dataset.state, c.dataset.token]))")
            for b, sample in enumerate(samples):
                frame = sample.frames[min(k, sample.steps) - 1]
                assert shown[b] == [[st, "" if t is None else str(t)] for st, t in zip(frame.state, frame.tokens)]
        answers = browser.evaluate("Array.from(document.querySelectorAll('.answer')).map(a => a.textContent)")
        assert answers == [f"answer: {t}" for t in result.text]
        browser.evaluate("dllmTrace.render(2)")
        assert "confidence" in browser.evaluate("document.querySelector('.sample .cell.committed').title")
        assert browser.overflow() == 0
        _shot(browser, tmp_path, "trace-html.png")
        assert browser.errors == []


@needs_chromium
@pytest.mark.parametrize("family", ["embedded", "embedded-bd"])       # masked, block diffusion
def test_playground_decodes_as_generate_does(embedded, family, tmp_path):
    import torch

    from dllm_decode.modelspec import ModelSpec, load_diffusion
    from dllm_decode.sampler import generate
    from dllm_decode.serve.app import background
    from tests.serve.conftest import default_config, make_state

    model = embedded if family == "embedded" else load_diffusion(ModelSpec.parse(family))
    config = default_config()
    expected = generate(model, [PROMPTS[0]], config, tokenizer=model.tokenizer,
                        generator=torch.Generator().manual_seed(config.seed))
    state = make_state(model, config=config)
    state.playground = True
    with background(state) as url, Browser() as browser:
        browser.open(url + "/")
        assert "embedded" in browser.evaluate("document.getElementById('model').textContent")
        browser.evaluate(f"document.getElementById('prompt').value = {PROMPTS[0]!r}")
        browser.evaluate("dllmPlayground.run()")
        browser.wait_for("dllmPlayground.state.done", timeout=120)
        got = browser.evaluate("JSON.parse(JSON.stringify(dllmPlayground.state))")
        assert got["error"] is None, got
        assert got["text"] == expected.text[0]
        assert browser.evaluate("document.getElementById('answer').textContent") == expected.text[0]
        assert got["nfe"] == int(expected.nfe[0])
        cells = browser.evaluate("document.querySelectorAll('#canvas .cell').length")
        assert cells == (config.gen_length if got["mode"] == "provisional" else got["steps"]) and cells > 0
        assert browser.overflow() == 0
        if family == "embedded":
            _shot(browser, tmp_path, "playground.png")
        assert browser.errors == []


def test_show_animates_on_a_pseudo_terminal():
    """`dllm-decode --show` run on a pty: styled frames, one per step, then the answer."""
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "dllm_decode", "--prompt", PROMPTS[0], "--show",
                                "--gen-length", "8"], stdin=subprocess.DEVNULL, stdout=follower,
                               stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "100", "TERM": "xterm"})
    os.close(follower)
    screen = read_screen(leader)
    assert process.wait(120) == 0, process.stderr.read().decode()
    plain = subprocess.run([sys.executable, "-m", "dllm_decode", "--prompt", PROMPTS[0], "--gen-length", "8"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert "\x1b[" in screen and "step 1/" in screen and "tokens per step" in screen
    assert screen.replace("\r", "").rstrip().splitlines()[-1] == plain


def _provisional_events(result, tokenizer, row: int) -> list[dict]:
    """The agreed provisional stream of one traced decode: per step a completion chunk with a
    top-level `dllm` object (tokens as text, one state per position, the committed text)."""
    from dllm_decode.viz.frames import result_frames, token_labels, used_ids

    sample = result_frames(result)[row]
    labels = token_labels(tokenizer, used_ids([sample]))
    events = []
    for frame in sample.frames:
        committed = []
        for state, tok in zip(frame.state, frame.tokens):
            if state != "committed" or tok in tokenizer.all_special_ids:
                break
            committed.append(tok)
        events.append({"id": "x", "object": "text_completion", "choices": [
            {"index": 0, "text": "", "logprobs": None, "finish_reason": None}],
            "dllm": {"kind": "provisional", "step": frame.step, "nfe": frame.step,
                     "tokens": [None if t is None else labels[t] for t in frame.tokens],
                     "state": list(frame.state), "committed_text": tokenizer.decode(committed)}})
    events.append({"id": "x", "object": "text_completion", "choices": [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}]})
    events.append({"id": "x", "object": "text_completion", "choices": [],
                   "dllm": {"nfe": int(result.nfe[row]), "seconds": 0.0}})
    return events


@needs_chromium
def test_playground_draws_the_provisional_stream_cell_by_cell(traced, tmp_path):
    """The playground against a stand-in server that streams the agreed provisional shape built
    from `trace=True`'s record: every step's cells in the page equal the trace's frame."""
    pytest.importorskip("fastapi")
    import json
    import threading

    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse, StreamingResponse

    from dllm_decode.serve.protocol import Settings
    from dllm_decode.viz.frames import result_frames, token_labels, used_ids
    from dllm_decode.viz.playground import playground_page
    from tests.serve.conftest import default_config

    result, tokenizer = traced
    events = _provisional_events(result, tokenizer, 0)
    asked: list[dict] = []
    app = FastAPI()
    page = playground_page(Settings(model_id="embedded", config=default_config()), provisional=True)
    app.get("/")(lambda: HTMLResponse(page))

    @app.post("/v1/completions")
    async def completions(request: Request):
        asked.append(await request.json())
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return StreamingResponse(iter([body]), media_type="text/event-stream")

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        with Browser() as browser:
            browser.open(f"http://127.0.0.1:{port}/")
            browser.evaluate(f"document.getElementById('prompt').value = {PROMPTS[0]!r}")
            browser.evaluate("dllmPlayground.run()")
            browser.wait_for("dllmPlayground.state.done", timeout=60)
            got = browser.evaluate("JSON.parse(JSON.stringify(dllmPlayground.state))")
            assert got["error"] is None and got["mode"] == "provisional"
            sample = result_frames(result)[0]
            labels = token_labels(tokenizer, used_ids([sample]))
            assert got["seen"] == [[f"{s}:{'' if t is None else labels[t]}" for s, t in zip(f.state, f.tokens)]
                                   for f in sample.frames]
            assert got["text"] == result.text[0] and got["nfe"] == int(result.nfe[0])
            assert asked[0]["dllm"]["stream_mode"] == "provisional" and asked[0]["stream"] is True
            _shot(browser, tmp_path, "playground-provisional.png")
            assert browser.errors == []
    finally:
        server.should_exit = True
        thread.join(10)


@needs_chromium
def test_terminal_frame_as_a_person_sees_it(traced, tmp_path):
    """A mid-decode frame of `--show`, recorded by rich as SVG and opened in Chromium: the cells
    carry their colours (the docs' terminal picture)."""
    from rich.console import Console, Group

    from dllm_decode.viz.frames import result_frames, token_labels, used_ids
    from dllm_decode.viz.terminal import rich_frame

    result, tokenizer = traced
    samples = result_frames(result)
    labels = token_labels(tokenizer, used_ids(samples))
    console = Console(record=True, width=90, file=open(os.devnull, "w"), force_terminal=True)
    console.print(Group(*(rich_frame(s, s.frames[1], labels, i, len(samples)) for i, s in enumerate(samples))))
    svg = tmp_path / "terminal.svg"
    import re

    # rich's SVG asks a web font of a CDN; this machine has no network, so drop it (local monospace)
    svg.write_text(re.sub(r"@font-face\s*{[^}]*}", "", console.export_svg(title="dllm-decode --show")))
    assert "fill=\"#" in svg.read_text()                     # styled cells, not plain text
    with Browser(width=900, height=260) as browser:
        browser.open(svg.as_uri())
        _shot(browser, tmp_path, "terminal-show.png")
        assert browser.errors == []
