"""Where a request's time goes at concurrency 1: the server's request path against the offline decode.

    OMP_NUM_THREADS=1 python scripts/profile_serving.py [--requests 320]     # from the checkout's root

The `bench serving` setup (the embedded model, its task prompts, greedy threshold 0.9, canvas 32
in blocks of 8): the requests decoded offline one at a time (`generate`), then sent one at a time
by a client in a child process to a server in this process. The server's functions along a
request's path are wrapped with timers (wall and the calling thread's CPU time), so the table
says per request: each part's milliseconds, on which thread, and the waits between threads
(a request handed to the engine thread until that thread takes it; the last update posted by
the engine until the event loop has it). Each server thread's whole CPU time comes from
/proc (what the wrapped parts do not cover: HTTP parsing, the ASGI stack, the event loop).

For a sampled profile of the same phases (no wrappers), py-spy:

    py-spy record -r 500 -f raw --threads -o out.txt -- python -m dllm_decode bench serving --clients 1
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import threading
import time
from typing import Any

import torch

from dllm_decode import engine as engine_module
from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Engine, Request
from dllm_decode.eval.bench.serving import load_clients
from dllm_decode.eval.bench.subject import load_subject, task_samples
from dllm_decode.registry import component
from dllm_decode.sampler import generate
from dllm_decode.serve import app, guard, protocol, worker
from dllm_decode.serve.app import Limits, ServerState, background
from dllm_decode.serve.protocol import Settings
from dllm_decode.serve.worker import EngineWorker

TOTALS: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
MARKS: dict[str, float] = {}


def timed(label: str, fn: Any) -> Any:
    """`fn` with its wall and thread-CPU seconds added to TOTALS[(thread, label)]."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            total = TOTALS[(short(threading.current_thread().name), label)]
            total[0] += time.perf_counter() - wall
            total[1] += time.thread_time() - cpu
            total[2] += 1
    return wrapper


def short(thread: str) -> str:
    return "offline" if thread == "MainThread" else thread.split("_")[0]


def until_replied(label: str, fn: Any) -> Any:
    """The ASGI middleware `fn` with the time from a request's arrival to its reply's last byte
    handed to the transport added to TOTALS."""
    @functools.wraps(fn)
    async def wrapper(self: Any, scope: Any, receive: Any, send: Any) -> None:
        began = time.perf_counter()

        async def sending(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                total = TOTALS[("dllm-serve", label)]
                total[0] += time.perf_counter() - began
                total[2] += 1

        await fn(self, scope, receive, sending)
    return wrapper


def wait(label: str) -> None:
    """Time from the mark `label` was set (on another thread) to now."""
    began = MARKS.pop(label, None)
    if began is not None:
        total = TOTALS[("wait", label)]
        total[0] += time.perf_counter() - began
        total[2] += 1


def instrument() -> None:
    """Wrap the request path (module attributes, so the server's own calls go through them)."""
    guard.Guard.__call__ = until_replied("arrival to reply sent (wall)", guard.Guard.__call__)
    app.parse_job = timed("parse_job (shape, record, tokenise)", protocol.parse_job)
    wrapped = [(guard, "_check_nesting", "body JSON + nesting check"),
               (protocol, "check_shape", "  shape check (pydantic)"), (protocol, "_config", "  decode record"),
               (protocol, "_encode", "  tokenise"), (protocol, "unknown_words_warning", "  unknown-word note"),
               (app, "_admit", "admit (Engine.check)"), (app, "reply", "reply body"),
               (Engine, "check", "Engine.check"), (Engine, "add", "Engine.add"), (Engine, "step", "Engine.step"),
               (Engine, "_decode", "  answer text decode"), (type(MODEL), "forward", "  model forward"),
               (engine_module.DiffusionBackend, "_start", "  new running batch"),
               (worker.EngineWorker, "_deliver", "deliver updates (hand-off)")]
    for owner, name, label in wrapped:
        setattr(owner, name, timed(label, getattr(owner, name)))

    submit, collect = worker.EngineWorker.submit, worker.EngineWorker._collect

    def submitting(self: Any, request: Any, sink: Any) -> None:
        MARKS["to engine"] = time.perf_counter()
        submit(self, request, sink)

    def collecting(self: Any, block: bool) -> Any:
        commands = collect(self, block)
        if commands:
            wait("to engine")
        return commands

    worker.EngineWorker.submit, worker.EngineWorker._collect = submitting, collecting
    post, drain = app.Mailbox.post, app.Mailbox._drain

    def posting(self: Any, queue: Any, item: Any) -> None:
        if item.finished:
            MARKS["to event loop"] = time.perf_counter()
        post(self, queue, item)

    def draining(self: Any) -> None:
        wait("to event loop")
        drain(self)

    app.Mailbox.post, app.Mailbox._drain = posting, draining


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, by name (from /proc)."""
    names = {t.native_id: short(t.name) for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = collections.defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[names.get(int(tid), "other")] += (int(fields[11]) + int(fields[12])) / ticks
    return out


MODEL: Any = None


def main() -> None:
    global MODEL
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=320)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bench = load_subject("embedded", canvases=("mask", "noise"))
    MODEL, tokenizer = bench.model, bench.tokenizer
    n = args.requests
    prompts = [s.prompt for s in task_samples(bench.tasks, -(-n // len(bench.tasks)))][:n]
    config = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": 0.9}),
                          gen_length=32, block_length=8)
    encode = timed("tokenise", tokenizer.__call__)
    decode = timed("generate", generate)
    instrument()
    for p in prompts[:8]:                                        # warm-up
        decode(MODEL, [encode(p, add_special_tokens=False)["input_ids"]], config)
    TOTALS.clear()
    began, cpu = time.perf_counter(), time.process_time()
    for p in prompts:
        decode(MODEL, [encode(p, add_special_tokens=False)["input_ids"]], config)
    offline = (time.perf_counter() - began) / n, (time.process_time() - cpu) / n
    offline_parts = {key: list(total) for key, total in TOTALS.items()}
    alone = Engine(MODEL, tokenizer, max_batch_size=32)          # the engine without the server
    began = time.process_time()
    for i, p in enumerate(prompts):
        alone.add(Request(id=str(i), prompt=tuple(encode(p, add_special_tokens=False)["input_ids"]),
                          config=config, follow=False))
        while alone.has_work:
            alone.step()
    engine_alone = (time.process_time() - began) / n
    state = ServerState(EngineWorker(Engine(MODEL, tokenizer, max_batch_size=32), threads=1),
                        Settings(model_id="embedded", config=config, max_tokens=1024), Limits(max_queue=n))
    bodies = [{"model": "embedded", "prompt": p} for p in prompts]
    with background(state) as url:
        load_clients(url, bodies[:8], 1)                         # warm-up
        TOTALS.clear()
        before, cpu = thread_cpu(), time.process_time()
        run = load_clients(url, bodies, 1)
        after, server_cpu = thread_cpu(), time.process_time() - cpu
    latency = sum(r["seconds"] for r in run["results"]) / n
    ms = 1000.0
    print(f"per request (n = {n}): offline {offline[0] * ms:.3f} ms wall, {offline[1] * ms:.3f} ms CPU; "
          f"server {latency * ms:.3f} ms latency at the client, {server_cpu / n * ms:.3f} ms CPU "
          f"(every thread of the server; wrappers included); the engine alone in one thread "
          f"{engine_alone * ms:.3f} ms CPU")
    print(f"{'thread':<12} {'part':<40} {'wall ms':>8} {'CPU ms':>8} {'calls':>6}")
    for name in sorted({t for t in after if t != "offline"}):
        print(f"{name:<12} {'(whole thread, /proc)':<40} {'':>8} {(after[name] - before.get(name, 0)) / n * ms:8.3f}")
    for (thread, label), (wall, cpu, calls) in [*offline_parts.items(), *TOTALS.items()]:
        print(f"{thread:<12} {label:<40} {wall / n * ms:8.3f} {cpu / n * ms if thread != 'wait' else 0:8.3f} "
              f"{calls / n:6.2f}")


if __name__ == "__main__":
    main()
