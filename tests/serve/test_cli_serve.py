"""`dllm-decode serve`: usage errors before anything starts, and a real process that serves and
stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from dllm_decode.cli import main
from tests.serve.conftest import post, wait_until

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


@pytest.mark.parametrize("args, fragment", [
    (["--scheduler", "nope"], "unknown scheduler 'nope'"),
    (["--gen-length", "2048", "--block-length", "32"], "exceeds --max-tokens 1024"),
    (["--max-concurrent", "0"], "0 is not in the range 1<=x<=4096"),
    (["--model", "ar:"], "needs a target model"),
    (["--model", "/no/such/dir"], "/no/such/dir"),
])
def test_usage_errors_exit_2(args, fragment):
    # a free port: a missing model folder is found when loading, after the address is checked
    result = CliRunner().invoke(main, ["serve", "--model", "tiny", "--port", str(_free_port()), *args])
    assert result.exit_code == 2 and fragment in result.output, result.output
    assert "Traceback" not in result.output


def test_a_bad_option_is_reported_even_when_the_port_is_taken():
    """Options are checked before the address: a taken port never hides a bad option."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        bad = CliRunner().invoke(main, ["serve", "--model", "tiny", "--port", port, "--scheduler", "nope"])
        assert bad.exit_code == 2 and "unknown scheduler 'nope'" in bad.output, bad.output
        good = CliRunner().invoke(main, ["serve", "--model", "tiny", "--port", port])
        assert good.exit_code == 2 and "cannot listen on" in good.output, good.output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_command_serves_and_stops_on_sigterm():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "dllm_decode", "serve", "--model", "tiny", "--port", str(port),
         "--gen-length", "16", "--block-length", "8", "--threads", "1", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        def up() -> bool:
            try:
                return post(url, "/v1/completions", {"prompt": "w1 w2"}, timeout=5)[0] == 200
            except OSError:
                return False
        assert wait_until(up, timeout=120), process.stdout.read1().decode() if process.poll() else "no answer"
        status, body = post(url, "/v1/completions", {"model": "tiny", "prompt": "w1 w2", "max_tokens": 8})
        assert status == 200 and body["usage"]["completion_tokens"] <= 8
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert time.monotonic() - started < 30
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
