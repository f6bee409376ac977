"""`--compile` / `--cuda-graphs` at every command that decodes: a requests file, `--stream`,
`serve` and `eval` give what they give without the flag, through one `GraphCache` reused
across batches; the flags' bad uses are the same one-line usage error everywhere.

`--compile` runs torch.compile's inductor; here every `GraphCache` is made with the "eager"
backend (dynamo traces the same step without code generation: seconds, not minutes)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main

EMBEDDED = ["--model", "embedded", "--gen-length", "16", "--block-length", "8"]
PROMPTS = ["sort : mia ella hank", "copy : tom ann", "sort : bob al sue tina", "copy : al"]


@pytest.fixture
def made(monkeypatch):
    """Every `GraphCache` made while the test runs (compile mode: the eager backend)."""
    from dllm_decode.capture.graphs import GraphCache

    caches = []
    original = GraphCache.__init__

    def init(self, mode="compile", *, backend=None, **options):
        original(self, mode, backend="eager" if mode == "compile" and backend is None else backend,
                 **options)
        caches.append(self)

    monkeypatch.setattr(GraphCache, "__init__", init)
    return caches


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_a_requests_file_with_compile_writes_the_same_records(tmp_path, made):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    outputs = {}
    for flag in ("--no-compile", "--compile"):
        out = tmp_path / f"{flag}.jsonl"
        result = run(*EMBEDDED, "--input", str(src), "--output", str(out), "--batch-size", "2", flag)
        assert result.exit_code == 0, result.output
        outputs[flag] = {r["id"]: (r["text"], r["nfe"], r["finish_reason"])
                         for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(outputs["--compile"]) == ["0", "1", "2", "3"]
    assert outputs["--compile"] == outputs["--no-compile"]
    # four requests in batches of two, one GraphCache: each bucket compiled once for the file
    assert len(made) == 1 and made[0].captures >= 1


def test_stream_with_compile_prints_the_same_answer(made):
    plain = run(*EMBEDDED, "--prompt", PROMPTS[0], "--stream")
    compiled = run(*EMBEDDED, "--prompt", PROMPTS[0], "--stream", "--compile")
    assert plain.exit_code == compiled.exit_code == 0, compiled.output
    assert compiled.stdout == plain.stdout and plain.stdout.strip()
    assert "compiled (torch.compile" in compiled.stderr             # said on stderr, not silent
    assert len(made) == 1 and made[0].captures >= 1


def test_an_engine_reuses_a_finished_batchs_graphs(embedded, made):
    """A batch that finishes hands its GraphCache to the next batch; two batches running at
    once hold one each (their K/V lives in the cache's buffers)."""
    from dllm_decode.config import DecodeConfig
    from dllm_decode.engine import Engine, Request
    from dllm_decode.registry import component

    def config(cache):
        return DecodeConfig(scheduler=component("scheduler", "threshold"), gen_length=16,
                            block_length=8, cache=component("cache", cache))

    ids = embedded.tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    answers = {}
    for capture in ("off", "compile"):
        engine = Engine(embedded, max_batch_size=4, capture=capture)
        assert engine.capture == capture
        for round_ in range(2):               # round 2 starts after round 1's batches finished
            engine.add(Request(f"none{round_}", ids, config("none")))
            engine.add(Request(f"prefix{round_}", ids, config("prefix")))
            while engine.has_work:
                answers.update({(capture, u.request_id): u.output.tokens
                                for u in engine.step() if u.output is not None})
    assert all(answers["compile", key] == answers["off", key] for _, key in answers)
    assert len(made) == 2 and not engine.backend.held and len(engine.backend.idle) == 2
    with pytest.raises(ValueError, match="capture must be one of"):
        Engine(embedded, capture="fast")


def test_serve_with_compile_answers_as_without(monkeypatch, made):
    """`dllm-decode serve --compile` builds its engine with the captured step (start-up line and
    /health say so) and answers a request as the eager server does."""
    import socket

    from dllm_decode.serve import app
    from tests.serve.conftest import post

    states = []
    monkeypatch.setattr(app, "serve", lambda state, **kwargs: states.append(state))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    for flag in ("--no-compile", "--compile"):
        result = run("serve", *EMBEDDED, "--port", port, "--threads", "1", flag)
        assert result.exit_code == 0, result.output
        assert f"(step: {'compile' if flag == '--compile' else 'eager'};" in result.output
    monkeypatch.undo()                        # the real server from here on
    answers = []
    for state, step in zip(states, ("eager", "compile")):
        with app.background(state) as url:
            with urllib.request.urlopen(url + "/health") as response:
                assert json.loads(response.read())["step"] == step
            status, body = post(url, "/v1/completions", {"model": "embedded", "prompt": PROMPTS[0],
                                                         "max_tokens": 16})
            assert status == 200, body
            answers.append(body["choices"][0]["text"])
    assert answers[0] == answers[1] and answers[0].strip()
    assert states[1].worker.engine.capture == "compile" and made[-1].captures >= 1


def test_eval_with_compile_equals_without(tmp_path, made):
    samples = {}
    for flag in ("--no-compile", "--compile"):
        out = tmp_path / flag
        result = CliRunner().invoke(main, ["eval", "--model", "embedded", "--tasks", "copy",
                                           "--limit", "2", "--gen-length", "16", "--block-length", "8",
                                           "--out", str(out), "--no-plots", "--no-progress", flag])
        assert result.exit_code == 0, result.output
        rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        samples[flag] = sorted((r["output"], r["nfe"]) for r in rows)
    assert len(samples["--compile"]) == 2 and samples["--compile"] == samples["--no-compile"]
    assert len(made) == 1 and made[0].captures >= 1


@pytest.mark.parametrize("command", [
    ["--prompt", "sort : mia"],
    ["--prompt", "sort : mia", "--stream"],
    ["--input", "{src}", "--output", "{out}"],
    ["serve", "--port", "0"],
    ["eval", "--tasks", "copy", "--limit", "1", "--out", "{out_dir}"],
])
def test_cuda_graphs_on_the_cpu_is_one_usage_error_everywhere(tmp_path, command):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "sort : mia"}\n')
    args = [a.format(src=src, out=tmp_path / "out.jsonl", out_dir=tmp_path / "eval") for a in command]
    result = CliRunner().invoke(main, [*args, "--model", "embedded", "--cuda-graphs"])
    assert result.exit_code == 2, result.output
    assert "--cuda-graphs needs a CUDA device (--device cuda), got cpu" in result.output
    assert "Traceback" not in result.output
    both = CliRunner().invoke(main, [*args, "--model", "embedded", "--cuda-graphs", "--compile"])
    assert both.exit_code == 2 and "--cuda-graphs and --compile are alternatives" in both.output


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["eval", "--tasks", "copy", "--out", "{out_dir}"]])
def test_compile_with_a_causal_lm_is_a_usage_error(tmp_path, command):
    args = [a.format(out_dir=tmp_path / "eval") for a in command]
    result = CliRunner().invoke(main, [*args, "--model", "ar:ar_target", "--compile"])
    assert result.exit_code == 2, result.output
    assert "captures a diffusion model's step" in result.output and "is a causal LM" in result.output
