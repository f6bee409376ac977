"""The `python -m` entry points beside `dllm-decode` (load-test clients, the Learn2PD comparison
tables): click commands with one-line usage errors (exit 2), run here through click's runner."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from click.testing import CliRunner

from dllm_decode.eval.training import filter as filter_table
from dllm_decode.eval.training import onpolicy
from dllm_decode.serve import loadtest


class _Echo(http.server.BaseHTTPRequestHandler):
    """A stand-in completions route: the prompt back as text, one token per word."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:                                    # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status, reply = (200, {"choices": [{"text": body["prompt"]}],
                               "usage": {"completion_tokens": len(body["prompt"].split())}})
        if body["prompt"] == "bad":
            status, reply = 400, {"error": {"message": "bad prompt", "type": "invalid_request_error"}}
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def echo_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_loadtest_sends_every_body_and_keeps_input_order(echo_server):
    bodies = [{"prompt": f"w{i} w{i}"} for i in range(7)] + [{"prompt": "bad"}]
    result = CliRunner().invoke(loadtest.main, [echo_server, "--clients", "3"], input=json.dumps(bodies))
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["clients"] == 3 and report["wall_seconds"] > 0
    assert [r["text"] for r in report["results"][:7]] == [b["prompt"] for b in bodies[:7]]
    assert all(r["completion_tokens"] == 2 for r in report["results"][:7])
    assert report["results"][7]["status"] == 400 and report["results"][7]["error"]["message"] == "bad prompt"


@pytest.mark.parametrize("args, stdin, fragment", [
    (["http://127.0.0.1:9", "--clients", "0"], "[]", "--clients"),
    (["127.0.0.1:9"], "[]", "expected http://HOST:PORT"),
    (["http://127.0.0.1:9"], "{oops", "not a JSON list"),
    (["http://127.0.0.1:9"], '{"prompt": "x"}', "must be a JSON list"),
])
def test_loadtest_usage_errors_are_one_line(args, stdin, fragment):
    result = CliRunner().invoke(loadtest.main, args, input=stdin)
    assert result.exit_code == 2 and fragment in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command, args, fragment", [
    (onpolicy.main, [], "Missing option '--weights'"),
    (onpolicy.main, ["--weights", "nopath"], "expected NAME=PATH"),
    (onpolicy.main, ["--weights", "a=x", "--per-task", "0"], "--per-task"),
    (onpolicy.main, ["--weights", "a=x", "--model", "/no/such/model"], "does not exist"),
    (filter_table.main, ["--model", "/no/such/model"], "does not exist"),
    (filter_table.main, ["--gen-length", "0"], "--gen-length"),
])
def test_comparison_tables_refuse_bad_options_in_one_line(command, args, fragment):
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


@pytest.mark.slow                          # about 25 s: 12 tasks x 8 decodes, three times
@pytest.mark.filterwarnings("ignore")      # the task prompts' words are unknown to the tiny tokenizer
def test_comparison_tables_run_on_the_tiny_model(tmp_path):
    from dllm_decode.filters.mlp import save_mlp
    from tests.filters.helpers import step_mlp

    weights = tmp_path / "step32.safetensors"
    save_mlp(step_mlp(32), weights)
    result = CliRunner().invoke(filter_table.main, ["--model", "tiny", "--per-task", "1", "--gen-length", "32",
                                                    "--weights", str(weights)])
    assert result.exit_code == 0, result.output
    table = json.loads(result.output[result.output.index("{"):])
    assert {"low_confidence", "learned+eotp", "oracle"} <= set(table)
    result = CliRunner().invoke(onpolicy.main, ["--model", "tiny", "--per-task", "1", "--gen-length", "32",
                                                "--weights", f"step={weights}"])
    assert result.exit_code == 0, result.output
    assert "learned step + eotp" in result.output
    bad = CliRunner().invoke(onpolicy.main, ["--model", "tiny", "--per-task", "1", "--gen-length", "32",
                                             "--weights", f"x={tmp_path / 'missing.safetensors'}"])
    assert bad.exit_code == 2 and "--weights" in bad.output and "Traceback" not in bad.output
