"""Two `dllm-decode serve` replicas behind a router from the package index, vllm-router or
sglang-router (the recipe of docs/guides/replicas.md), on loopback: every request is answered once
and equals offline `generate`; killing one replica mid-run loses at most its in-flight requests.
Each router's runs are skipped without its package."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

pytestmark = pytest.mark.slow
ROUTERS = ["vllm_router", "sglang_router"]

CLIENTS = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def health(url: str) -> dict | None:
    """A replica's /health body (the router answers plain text: {"text": ...}); None when down."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            raw = response.read()
    except OSError:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"text": raw.decode(errors="replace")}


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}")
        if health(url) is not None:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer /health within {timeout:g} s")


@pytest.fixture(scope="module", params=ROUTERS)
def fleet(request, tmp_path_factory):
    """(router URL, [replica URLs], [replica processes]); every process ends with the module."""
    if importlib.util.find_spec(request.param) is None:
        pytest.skip(f"needs the {request.param.replace('_', '-')} package")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs = tmp_path_factory.mktemp("fleet")
    processes, replicas = [], []
    try:
        for i in range(2):
            port = free_port()
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "dllm_decode", "serve", "--model", "embedded", "--port", str(port),
                 "--threads", "1", "--max-concurrent", "4", "--log-level", "warning"],
                env=env, stdout=subprocess.DEVNULL, stderr=open(logs / f"replica{i}.log", "w")))
            replicas.append(f"http://127.0.0.1:{port}")
        for url, process in zip(replicas, processes):
            wait_healthy(url, process)
        port = free_port()
        router = subprocess.Popen(
            [sys.executable, "-m", f"{request.param}.launch_router", "--host", "127.0.0.1", "--port", str(port),
             "--worker-urls", *replicas, "--policy", "round_robin", "--prometheus-port", str(free_port()),
             "--health-check-interval-secs", "1", "--worker-startup-check-interval", "1"],
            env=env, stdout=subprocess.DEVNULL, stderr=open(logs / "router.log", "w"))
        processes.append(router)
        wait_healthy(f"http://127.0.0.1:{port}", router, timeout=60)
        yield f"http://127.0.0.1:{port}", replicas, processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def bodies(count: int) -> list[dict]:
    words = ["3 1 2", "4 0 6", "9 8 7 6", "1 2", "5 5 1", "2 4 6 8 1"]
    return [{"model": "embedded", "prompt": f"sort: {words[i % len(words)]} {i % 7}", "max_tokens": 16, "seed": i}
            for i in range(count)]


def offline(embedded, sent: list[dict], replies: list[dict]) -> None:
    """Each answered request equals `generate` on its prompt alone with the record it reports."""
    from dllm_decode.config import DecodeConfig
    from dllm_decode.sampler import generate

    expected: dict[str, str] = {}
    for body, result in zip(sent, replies):
        if result["status"] != 200:
            continue
        key = body["prompt"] + f"|{body['seed']}"
        if key not in expected:
            config = DecodeConfig.from_dict(result["config"])
            expected[key] = generate(embedded, [body["prompt"]], config).text[0].strip()
        assert result["text"] == expected[key], body


def run(url: str, sent: list[dict]) -> list[dict]:
    from dllm_decode.serve.loadtest import run_clients

    results = run_clients(url, sent, CLIENTS)["results"]
    return results


def annotate(url: str, sent: list[dict], results: list[dict]) -> list[dict]:
    """The loadtest results plus each reply's resolved record (asked again directly: the
    loadtest client keeps text only)."""
    from tests.serve.conftest import post

    status, reply = post(url, "/v1/completions", sent[0])
    assert status == 200, reply
    config = reply["dllm"]["config"]
    return [{**r, "config": {**config, "seed": b["seed"]}} for r, b in zip(results, sent)]


def test_every_request_answered_once_and_equal_to_generate(fleet, embedded):
    router, replicas, _ = fleet
    sent = bodies(40)
    before = [health(url)["served"] for url in replicas]
    results = annotate(router, sent, run(router, sent))
    assert [r["status"] for r in results] == [200] * len(sent)
    served = [health(url)["served"] - b for url, b in zip(replicas, before)]
    assert sum(served) == len(sent) + 1          # + the one `annotate` asked again
    assert min(served) > 0                       # both replicas took work
    offline(embedded, sent, results)


def test_killing_a_replica_loses_only_its_in_flight_requests(fleet, embedded):
    router, replicas, processes = fleet
    sent = bodies(200)
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.update(results=run(router, sent)))
    start = health(replicas[1])["served"]
    worker.start()
    deadline = time.monotonic() + 300
    while (health(replicas[1]) or {"served": start})["served"] - start < 20:
        assert worker.is_alive() and time.monotonic() < deadline, "the second replica got no work"
        time.sleep(0.05)
    processes[1].send_signal(signal.SIGKILL)
    worker.join(600)
    results = annotate(router, sent, outcome["results"])
    failed = [r for r in results if r["status"] != 200]
    assert len(results) == len(sent)
    print(f"killed one replica: {len(failed)} of {len(sent)} requests failed, statuses "
          f"{sorted({r['status'] for r in failed})}")
    assert len(failed) <= CLIENTS, failed[:3]    # at most the requests in flight at the kill
    offline(embedded, sent, results)
