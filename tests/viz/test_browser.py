"""The HTML trace, the playground and the terminal animation as a person sees them: a real
headless Chromium (the system's package; skipped when absent) and a real pseudo-terminal.

`DLLM_SCREENSHOTS=docs/assets python -m pytest -m slow tests/viz/test_browser.py` refreshes the
docs' screenshots."""

from __future__ import annotations

import os
import pty
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.browser import Browser, chromium

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


@contextmanager
def _serve(model: str):
    """`dllm-decode serve --model MODEL` on a free loopback port, as a user starts it (the
    playground on by default there); yields its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tempfile.TemporaryFile()
    process = subprocess.Popen([sys.executable, "-m", "dllm_decode", "serve", "--model", model, "--host", "127.0.0.1",
                                "--port", str(port)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"the server did not start: {log.read().decode()[-2000:]}")
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log.close()


CELLS = "Array.from(document.querySelectorAll('#canvas .cell')).map(c => [c.dataset.state, c.dataset.token])"


@needs_chromium
@pytest.mark.parametrize("family", ["embedded", "embedded-bd"])       # masked, block diffusion
def test_playground_draws_the_real_provisional_stream(family, tmp_path):
    """The playground against a real `dllm-decode serve`: it asks for the provisional stream
    with only public request fields, and every step's canvas it draws (live, then through the
    replay slider) equals `generate(..., trace=True)`'s frame for the same request, cell by
    cell; its answer and NFE equal `generate`'s."""
    import json

    import torch

    from dllm_decode.config import DecodeConfig
    from dllm_decode.modelspec import ModelSpec, load_diffusion
    from dllm_decode.sampler import generate
    from dllm_decode.serve.protocol import DLLM_KEYS
    from dllm_decode.viz.frames import result_frames

    with _serve(family) as url, Browser() as browser:
        browser.open(url + "/")
        server = json.loads(browser.evaluate("document.getElementById('server-config').textContent"))
        assert server["model"] == family and server["provisional"] is True and server["end_of_text"]
        browser.evaluate("window.asked = []; const f = window.fetch; "
                         "window.fetch = (u, o) => { window.asked.push([u, JSON.parse(o.body)]); return f(u, o); }")
        browser.evaluate(f"document.getElementById('prompt').value = {PROMPTS[0]!r}")
        browser.evaluate("dllmPlayground.run()")
        browser.wait_for("dllmPlayground.state.done", timeout=120)
        got = browser.evaluate("JSON.parse(JSON.stringify(dllmPlayground.state))")
        asked = browser.evaluate("window.asked")
        steps = len(got["seen"])
        replayed = []
        for k in range(1, steps + 1):
            browser.evaluate(f"dllmPlayground.replay({k})")
            replayed.append(browser.evaluate(CELLS))
        eot_cells = browser.evaluate("Array.from(document.querySelectorAll('#canvas .cell'))"
                                     ".filter(c => c.textContent === '∎').length")
        if family == "embedded":          # the docs' picture: step 2, committed and provisional cells
            browser.evaluate("dllmPlayground.replay(2)")
            _shot(browser, tmp_path, "playground.png")
        assert browser.overflow() == 0
        assert browser.errors == []

    assert got["error"] is None and got["mode"] == "provisional"
    [(path, body)] = asked                                             # one request, public fields
    assert path == "/v1/completions" and body["stream"] is True
    assert body["dllm"] == {"stream_mode": "provisional"} and set(body["dllm"]) <= set(DLLM_KEYS)
    model = load_diffusion(ModelSpec.parse(family))
    config = DecodeConfig.from_dict(server["config"])
    expected = generate(model, [PROMPTS[0]], config, tokenizer=model.tokenizer, trace=True,
                        generator=torch.Generator().manual_seed(config.seed))
    frames = result_frames(expected)[0].frames
    label = {t: model.tokenizer.batch_decode([[t]])[0] for f in frames for t in f.tokens if t is not None}
    want = [[[s, "" if t is None else label[t]] for s, t in zip(f.state, f.tokens)] for f in frames]
    assert replayed == want
    assert got["seen"] == [[f"{s}:{t}" for s, t in frame] for frame in want]
    assert any(s == "provisional" for frame in want for s, _ in frame)
    assert got["text"] == expected.text[0] and got["nfe"] == int(expected.nfe[0]) == steps
    assert eot_cells == sum(t in server["end_of_text"] for _, t in want[-1])       # drawn as ∎
    assert eot_cells > 0 or family == "embedded-bd"                    # (its answer fills the canvas)


@needs_chromium
def test_playground_sends_typed_scheduler_options(tmp_path):
    """Options typed as `KEY=VALUE` reach the server as JSON values (a number, not the text "0.5"),
    and the answer is `generate`'s with them."""
    import torch

    from dllm_decode.config import DecodeConfig
    from dllm_decode.modelspec import ModelSpec, load_diffusion
    from dllm_decode.sampler import generate

    with _serve("embedded") as url, Browser() as browser:
        browser.open(url + "/")
        browser.wait_for("window.dllmPlayground !== undefined", timeout=30)
        config = browser.evaluate("JSON.parse(document.getElementById('server-config').textContent).config")
        browser.evaluate("document.getElementById('scheduler').value = 'threshold';"
                         "document.getElementById('options').value = 'threshold=0.5';"
                         f"document.getElementById('prompt').value = {PROMPTS[1]!r}")
        browser.evaluate("dllmPlayground.run()")
        browser.wait_for("dllmPlayground.state.done", timeout=120)
        got = browser.evaluate("JSON.parse(JSON.stringify(dllmPlayground.state))")
        assert browser.errors == []
    assert got["error"] is None and got["mode"] == "provisional"
    model = load_diffusion(ModelSpec.parse("embedded"))
    config = DecodeConfig.from_dict({**config, "scheduler": {"name": "threshold", "threshold": 0.5}})
    expected = generate(model, [PROMPTS[1]], config, tokenizer=model.tokenizer,
                        generator=torch.Generator().manual_seed(config.seed))
    assert got["text"] == expected.text[0] and got["nfe"] == int(expected.nfe[0])


@needs_chromium
def test_playground_without_the_provisional_stream(embedded, monkeypatch):
    """A protocol without `dllm.stream_mode` (an older server): the page sees it, asks for the
    committed stream, draws one box per update, and ends with `generate`'s answer and NFE."""
    import torch

    from dllm_decode.sampler import generate
    from dllm_decode.serve import protocol
    from dllm_decode.serve.app import background
    from tests.serve.conftest import default_config, make_state

    monkeypatch.setattr(protocol, "DLLM_KEYS", tuple(k for k in protocol.DLLM_KEYS if k != "stream_mode"))
    config = default_config()
    expected = generate(embedded, [PROMPTS[0]], config, tokenizer=embedded.tokenizer,
                        generator=torch.Generator().manual_seed(config.seed))
    state = make_state(embedded, config=config)
    state.playground = True
    with background(state) as url, Browser() as browser:
        browser.open(url + "/")
        browser.wait_for("window.dllmPlayground !== undefined", timeout=30)
        browser.evaluate(f"document.getElementById('prompt').value = {PROMPTS[0]!r}")
        browser.evaluate("dllmPlayground.run()")
        browser.wait_for("dllmPlayground.state.done", timeout=120)
        got = browser.evaluate("JSON.parse(JSON.stringify(dllmPlayground.state))")
        boxes = browser.evaluate("Array.from(document.querySelectorAll('#canvas .cell')).map(c => c.textContent)")
        assert "committed text only" in browser.evaluate("document.getElementById('mode-note').textContent")
        assert browser.errors == []
    assert got["error"] is None and got["mode"] == "committed"
    assert got["text"] == expected.text[0] and got["nfe"] == int(expected.nfe[0])
    assert "".join(boxes) == expected.text[0] and len(boxes) == got["steps"] > 0


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
