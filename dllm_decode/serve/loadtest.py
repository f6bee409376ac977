"""Load-test clients: N concurrent HTTP clients sending a list of request bodies to a server.

The standard library and click only (no torch), so it starts at once in its own process (the
benchmark starts it that way, keeping the clients off the server's interpreter lock):

    python -m dllm_decode.serve.loadtest http://127.0.0.1:8000 --clients 64 < bodies.json > results.json

Input: a JSON list of `/v1/completions` bodies. Output: a JSON object with `wall_seconds` and, per
body in input order, `status`, `seconds` (latency), and `text` / `completion_tokens` (or the error).
A streamed body (`"stream": true`) is read as server-sent events: its `first_token_seconds` is
the time to the first chunk with text, and `cached_tokens` comes from its usage chunk (ask for
it with `stream_options.include_usage`); an unstreamed reply reports `cached_tokens` too.
Each client keeps one HTTP/1.1 connection and takes the next body when its reply is complete.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
import urllib.parse
from typing import Any

import click


def run_clients(url: str, bodies: list[dict[str, Any]], clients: int,
                path: str = "/v1/completions", timeout: float = 600.0) -> dict[str, Any]:
    """Send every body once, `clients` at a time. A request that never gets a reply is reported
    with status 0 (lost)."""
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    target = urllib.parse.urlsplit(url)
    results: list[dict[str, Any] | None] = [None] * len(bodies)
    lock = threading.Lock()
    cursor = iter(range(len(bodies)))

    def client() -> None:
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=timeout)
        while True:
            with lock:
                index = next(cursor, None)
            if index is None:
                break
            started = time.perf_counter()
            try:
                connection.request("POST", path, json.dumps(bodies[index]),
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                if response.status == 200 and bodies[index].get("stream"):
                    results[index] = _streamed(response, started)
                    continue
                status, raw = response.status, response.read()
            except (OSError, http.client.HTTPException, ValueError) as err:
                connection.close()
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=timeout)
                results[index] = {"status": 0, "seconds": time.perf_counter() - started, "error": repr(err)}
                continue
            seconds = time.perf_counter() - started
            body = json.loads(raw)
            if status == 200:
                results[index] = {"status": status, "seconds": seconds, "text": body["choices"][0]["text"],
                                  "completion_tokens": body["usage"]["completion_tokens"],
                                  "cached_tokens": _cached(body["usage"])}
            else:
                results[index] = {"status": status, "seconds": seconds, "error": body.get("error")}
        connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(clients, len(bodies)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return {"wall_seconds": wall, "clients": clients,
            "results": [r if r is not None else {"status": 0, "error": "no reply"} for r in results]}


def _streamed(response: Any, started: float) -> dict[str, Any]:
    """A 200 server-sent-event reply read to its end: text, time to the first text, usage."""
    text, first, usage = "", None, {}
    for line in response:
        line = line.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        event = json.loads(line[5:])
        usage = event.get("usage") or usage
        for choice in event.get("choices") or ():
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if piece and first is None:
                first = time.perf_counter() - started
            text += piece
    seconds = time.perf_counter() - started
    return {"status": 200, "seconds": seconds, "first_token_seconds": seconds if first is None else first,
            "text": text, "completion_tokens": usage.get("completion_tokens", 0), "cached_tokens": _cached(usage)}


def _cached(usage: dict[str, Any]) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))


@click.command("loadtest", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("url")
@click.option("--clients", type=click.IntRange(1), default=64, show_default=True,
              help="Concurrent clients, one HTTP/1.1 connection each.")
@click.option("--path", default="/v1/completions", show_default=True, help="The route every body is POSTed to.")
def main(url: str, clients: int, path: str) -> None:
    """Send the JSON list of request bodies on standard input to the server at URL, CLIENTS at a
    time; print the replies and latencies as one JSON object."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise click.BadParameter(f"expected http://HOST:PORT, got {url!r}", param_hint="URL")
    try:
        bodies = json.load(sys.stdin)
    except ValueError as err:
        raise click.UsageError(f"standard input is not a JSON list of request bodies: {err}") from None
    if not isinstance(bodies, list) or not all(isinstance(b, dict) for b in bodies):
        raise click.UsageError("standard input must be a JSON list of request bodies (objects)")
    json.dump(run_clients(url, bodies, clients, path), sys.stdout)


if __name__ == "__main__":
    main()
