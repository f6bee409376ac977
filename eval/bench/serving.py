"""Load-test `dllm-decode serve`: many concurrent clients against the same requests one at a time.

    dllm-decode bench serving [--requests 320] [--clients 64] [--max-batch 32] [--json FILE] [--quick]

One run, side by side: every request is first decoded offline, alone (`generate`, the reference
answers and the no-server baseline); then a server on 127.0.0.1 (in this process, the engine in
its worker thread) gets the same requests from one client at a time, then from `--clients`
concurrent clients (`dllm_decode.serve.loadtest`, in a child process so the clients do not compete
for this interpreter's lock). Reported per phase: requests answered, failed (non-200), lost (no
reply), answers differing from the offline one, wall time, requests/s, answer tokens/s, p50/p99
latency; and the concurrent/sequential throughput ratio. Beside wall time, the CPU seconds of this
process (offline decode; the server's threads per phase, the clients excluded): on a shared machine
they move less with other work than wall time does. Greedy decoding (threshold 0.9), prompts
from the task suite (`dllm_decode.eval.tasks`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Engine
from dllm_decode.eval.bench.protocol import blame
from dllm_decode.eval.bench.subject import load_subject, task_samples
from dllm_decode.eval.bench.timing import check_counts
from dllm_decode.registry import component
from dllm_decode.sampler import generate
from dllm_decode.serve.app import Limits, ServerState, background
from dllm_decode.serve.protocol import Settings
from dllm_decode.serve.worker import EngineWorker


@dataclass(frozen=True)
class ServingOptions:
    """What `bench serving` runs: `requests` task prompts, `clients` concurrent clients, an engine of
    `max_batch` rows, greedy threshold decoding at `gen_length` / `block_length`.

    Raises:
        ValueError: a count below 1, or a block that does not divide the canvas.
    """

    model: str = "embedded"
    requests: int = 320
    clients: int = 64
    max_batch: int = 32
    gen_length: int = 32
    block_length: int = 8
    threshold: float = 0.9
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        check_counts(self, "requests", "clients", "max_batch", "gen_length", "block_length", "threads")
        if self.block_length > self.gen_length or self.gen_length % self.block_length:
            raise ValueError(f"block_length {self.block_length} must divide gen_length {self.gen_length}")


def run(o: ServingOptions, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """The benchmark (see the module docstring); returns the report as a dict."""
    model_name, requests, clients, max_batch = o.model, o.requests, o.clients, o.max_batch
    gen, block, threshold, seed = o.gen_length, o.block_length, o.threshold, o.seed
    torch.set_num_threads(o.threads)
    with blame("--model"):                # a noise model, a missing or corrupt folder: one line
        bench = load_subject(model_name)
    if bench.tasks is None:
        raise ValueError(f"{bench.label}: the load test needs the task suite's vocabulary (the embedded model)")
    model, tokenizer = bench.model, bench.tokenizer
    per_task = -(-requests // len(bench.tasks))
    prompts = [s.prompt for s in task_samples(bench.tasks, per_task, seed=seed)][:requests]
    config = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": threshold}),
                          gen_length=gen, block_length=block)
    progress(f"offline: {requests} requests one at a time ...")
    started, cpu = time.perf_counter(), time.process_time()
    reference = [generate(model, [tokenizer(p, add_special_tokens=False)["input_ids"]], config).text[0]
                 for p in prompts]
    offline_wall, offline_cpu = time.perf_counter() - started, time.process_time() - cpu
    settings = Settings(model_id=model_name, config=config, max_tokens=max(gen, 1024))
    state = ServerState(EngineWorker(Engine(model, tokenizer, max_batch_size=max_batch), threads=o.threads),
                        settings, Limits(max_queue=requests))
    bodies = [{"model": model_name, "prompt": p} for p in prompts]
    phases = {}
    with background(state) as url:
        load_clients(url, bodies[:2], 1)                         # warm-up
        for name, n in (("sequential", 1), ("concurrent", clients)):
            progress(f"{name}: {requests} requests from {n} client(s) ...")
            steps, cpu = state.worker.engine.steps, time.process_time()
            phases[name] = _summary(load_clients(url, bodies, n), reference)
            phases[name]["engine_steps"] = state.worker.engine.steps - steps
            phases[name]["server_cpu_seconds"] = round(time.process_time() - cpu, 3)  # clients run apart
    report = {
        "model": bench.label, "requests": requests, "clients": clients, "max_batch": max_batch,
        "config": config.to_dict(), "offline_wall_seconds": round(offline_wall, 3),
        "offline_requests_per_second": round(requests / offline_wall, 3), **phases,
        "throughput_ratio": round(phases["concurrent"]["requests_per_second"]
                                  / phases["sequential"]["requests_per_second"], 3),
        # the server's own cost: a request through it at concurrency 1 against its offline decode
        "server_over_offline": round(requests / offline_wall / phases["sequential"]["requests_per_second"], 3),
        "concurrent_over_offline": round(phases["concurrent"]["requests_per_second"] * offline_wall / requests, 3),
        # the same two ratios in CPU seconds (this process: less swayed by other work on the machine)
        "offline_cpu_seconds": round(offline_cpu, 3),
        "server_over_offline_cpu": round(phases["sequential"]["server_cpu_seconds"] / offline_cpu, 3),
        "concurrent_over_offline_cpu": round(offline_cpu / phases["concurrent"]["server_cpu_seconds"], 3),
    }
    return report


def load_clients(url: str, bodies: list[dict[str, Any]], clients: int) -> dict[str, Any]:
    """The load-test clients (`dllm_decode.serve.loadtest`) in a child process: their report."""
    done = subprocess.run([sys.executable, "-m", "dllm_decode.serve.loadtest", url, "--clients", str(clients)],
                          input=json.dumps(bodies), capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _summary(run: dict[str, Any], reference: list[str]) -> dict[str, Any]:
    results = run["results"]
    ok = [r for r in results if r["status"] == 200]
    latencies = sorted(r["seconds"] for r in ok)
    wall = run["wall_seconds"]
    return {
        "answered": len(ok), "failed": sum(r["status"] not in (0, 200) for r in results),
        "lost": sum(r["status"] == 0 for r in results),
        "different_from_offline": sum(r["status"] == 200 and r["text"] != ref for r, ref in zip(results, reference)),
        "wall_seconds": round(wall, 3), "requests_per_second": round(len(ok) / wall, 3),
        "answer_tokens_per_second": round(sum(r["completion_tokens"] for r in ok) / wall, 1),
        "latency_p50": round(quantile(latencies, 0.5), 4), "latency_p99": round(quantile(latencies, 0.99), 4),
    }


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] if len(values) > 1 \
        else values[0]


def format_serving(report: dict[str, Any]) -> str:
    lines = [f"serving load test: {report['model']}, {report['requests']} requests, "
             f"{report['clients']} clients, max batch {report['max_batch']}",
             f"offline one at a time: {report['offline_wall_seconds']} s "
             f"({report['offline_requests_per_second']} req/s)",
             f"{'phase':<11} {'ok':>4} {'fail':>4} {'lost':>4} {'diff':>4} {'wall s':>8} {'req/s':>7} "
             f"{'tok/s':>7} {'p50 s':>7} {'p99 s':>7} {'steps':>6}"]
    for name in ("sequential", "concurrent"):
        p = report[name]
        lines.append(f"{name:<11} {p['answered']:>4} {p['failed']:>4} {p['lost']:>4} "
                     f"{p['different_from_offline']:>4} {p['wall_seconds']:>8} {p['requests_per_second']:>7} "
                     f"{p['answer_tokens_per_second']:>7} {p['latency_p50']:>7} {p['latency_p99']:>7} "
                     f"{p['engine_steps']:>6}")
    lines.append(f"throughput concurrent / sequential: {report['throughput_ratio']}x")
    lines.append(f"time per request, server at concurrency 1 / offline: {report['server_over_offline']}x; "
                 f"throughput concurrent / offline one at a time: {report['concurrent_over_offline']}x")
    if "offline_cpu_seconds" in report:
        lines.append(f"in CPU seconds of this process (the clients excluded): offline {report['offline_cpu_seconds']}, "
                     f"server at concurrency 1 / offline {report['server_over_offline_cpu']}x; requests per CPU "
                     f"second, concurrent / offline one at a time {report['concurrent_over_offline_cpu']}x")
    return "\n".join(lines)
