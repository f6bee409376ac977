"""`bench serving --workload shared-prefix`: requests sharing a long system prompt, and two-turn
chats, served with and without the cross-request prefix cache, side by side in one run.

    dllm-decode bench serving --workload shared-prefix --model embedded-bd [--requests 48]
        [--chats 8] [--clients 8] [--max-batch 8] [--prefix-tokens 256] [--repeats 2]

The prompts are token ids: one system prompt of `prefix_tokens` tokens (task prompts run
together), then for each request a task prompt of its own; each chat's second turn is its first
turn, the first turn's offline answer and a new task prompt. Every request is first decoded
offline, alone (`generate`, the reference answers). Then, per phase, a fresh server on
127.0.0.1 (engine in its worker thread) gets every request, streamed, from `clients` concurrent
clients (`dllm_decode.serve.loadtest`, in a child process): once with the prefix cache off and once
with it on (`prefix_cache_bytes`), alternating which goes first over `repeats` pairs. Reported per
phase: requests/s, time to first text (p50/p99), latency, answers differing from the offline ones,
prompt tokens served from the cache, the store's bytes, and the server's CPU seconds (this
process's, the clients excluded: less swayed than wall time by other work on a shared machine);
and per pair the on/off ratios of requests/s and of requests per CPU second.
The decode is greedy threshold decoding with the exact `block` cache on a block-diffusion model,
or, on a uniform-noise model (`embedded-noise`, DiffusionGemma), its shipped decoding (seeded
sampling), where the prefix cache reuses the causal encoder's prompt K/V
(`dllm_decode.encoder_reuse`): exact there too, so answers equal the offline ones.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Engine, check_cache
from dllm_decode.eval.bench.serving import load_clients, quantile
from dllm_decode.eval.bench.protocol import OptionError, blame
from dllm_decode.eval.bench.subject import load_subject, task_samples
from dllm_decode.eval.bench.timing import check_counts
from dllm_decode.noise import canvas_kind
from dllm_decode.registry import component
from dllm_decode.sampler import generate
from dllm_decode.serve.app import Limits, ServerState, background
from dllm_decode.serve.protocol import Settings
from dllm_decode.serve.worker import EngineWorker


@dataclass(frozen=True)
class SharedPrefixOptions:
    """What the shared-prefix workload runs (see the module docstring).

    Raises:
        ValueError: a count below 1, a block that does not divide the canvas, a system prompt
            shorter than 4 answers.
    """

    model: str = "embedded-bd"
    requests: int = 48
    chats: int = 8
    clients: int = 8
    max_batch: int = 8
    gen_length: int = 32
    block_length: int = 8
    prefix_tokens: int = 256
    prefix_cache_bytes: int = 64 << 20
    repeats: int = 2
    threshold: float = 0.9
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        check_counts(self, "requests", "chats", "clients", "max_batch", "gen_length", "block_length",
                     "prefix_tokens", "prefix_cache_bytes", "repeats", "threads")
        if self.block_length > self.gen_length or self.gen_length % self.block_length:
            raise ValueError(f"block_length {self.block_length} must divide gen_length {self.gen_length}")
        if self.prefix_tokens < 4 * self.gen_length:
            raise ValueError(f"prefix_tokens {self.prefix_tokens} must be at least 4x gen_length "
                             f"{self.gen_length} (a long shared system prompt)")


def run(o: SharedPrefixOptions, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """The workload (see the module docstring); returns the report as a dict."""
    torch.set_num_threads(o.threads)
    with blame("--model"):                # a missing or corrupt folder: one line
        bench = load_subject(o.model, canvases=("mask", "noise"))
    if bench.tasks is None:
        raise ValueError(f"{bench.label}: the workload needs the task suite's vocabulary (an embedded model)")
    model, tokenizer = bench.model, bench.tokenizer
    context = getattr(model, "max_length", None)
    if context is not None and o.prefix_tokens + 3 * o.gen_length > context:
        raise OptionError("--prefix-tokens", f"prefix_tokens {o.prefix_tokens} + a chat's two turns "
                          f"(3 x gen_length {o.gen_length}) exceed the model's context of {context} tokens")
    config = _config(model, o)
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]   # noqa: E731
    draws = o.requests + 2 * o.chats + 64 + o.prefix_tokens     # each sample adds >= 1 system token
    samples = [s.prompt for s in task_samples(bench.tasks, -(-draws // len(bench.tasks)),
                                              seed=o.seed)]
    system, questions = [], iter(samples)
    while len(system) < o.prefix_tokens:
        system += ids(next(questions) + " ;")
    system = system[:o.prefix_tokens]
    singles = [system + ids(" " + next(questions)) for _ in range(o.requests)]
    firsts = [system + ids(" " + next(questions)) for _ in range(o.chats)]
    progress(f"offline: {o.requests + 2 * o.chats} requests one at a time ...")
    answer = lambda prompt: generate(model, [prompt], config)               # noqa: E731
    first_answers = [answer(p) for p in firsts]
    prompts = list(singles[:o.requests // 2]) + firsts + list(singles[o.requests // 2:])
    prompts += [p + _answer_ids(r, model) + ids(" ; " + next(questions)) for p, r in zip(firsts, first_answers)]
    started = time.perf_counter()
    texts = [answer(p).text[0] for p in prompts]
    offline = time.perf_counter() - started
    bodies = [{"model": o.model, "prompt": p, "stream": True, "stream_options": {"include_usage": True}}
              for p in prompts]
    phases: list[dict[str, Any]] = []
    for pair in range(o.repeats):
        order = ("off", "on") if pair % 2 == 0 else ("on", "off")
        for mode in order:
            progress(f"pair {pair + 1}/{o.repeats}, prefix cache {mode}: {len(bodies)} requests from "
                     f"{o.clients} clients ...")
            phases.append({"pair": pair, "prefix_cache": mode,
                           **_phase(model, tokenizer, config, o, bodies, texts, mode == "on")})
    ratios = [_rate(phases, p, "on") / _rate(phases, p, "off") for p in range(o.repeats)]
    cpu_ratios = [_rate(phases, p, "on", "requests_per_cpu_second") / _rate(phases, p, "off", "requests_per_cpu_second")
                  for p in range(o.repeats)]
    return {"model": bench.label, "workload": "shared-prefix", "requests": len(bodies),
            "single_turn": o.requests, "chats": o.chats, "prefix_tokens": o.prefix_tokens,
            "prompt_tokens_mean": round(statistics.fmean(len(p) for p in prompts), 1),
            "clients": o.clients, "max_batch": o.max_batch, "prefix_cache_bytes": o.prefix_cache_bytes,
            "config": config.to_dict(), "offline_requests_per_second": round(len(prompts) / offline, 3),
            "phases": phases, "speedup": [round(r, 3) for r in ratios],
            "speedup_range": [round(min(ratios), 3), round(max(ratios), 3)],
            "cpu_speedup": [round(r, 3) for r in cpu_ratios],
            "cpu_speedup_range": [round(min(cpu_ratios), 3), round(max(cpu_ratios), 3)],
            "identical": all(p["different_from_offline"] == 0 and p["answered"] == len(bodies) for p in phases)}


def _config(model: Any, o: SharedPrefixOptions) -> DecodeConfig:
    """A noise model's shipped decoding (its encoder's prompt K/V are reused), else threshold
    decoding under the exact `block` cache (refused in one line for a model without blocks)."""
    if canvas_kind(model) == "noise":
        return DecodeConfig.for_model(model, o.gen_length)
    config = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": o.threshold}),
                          cache=component("cache", "block"), gen_length=o.gen_length,
                          block_length=o.block_length)
    with blame("--model"):                # the exact `block` cache: a block-diffusion model
        check_cache(model, config)
    return config


def _answer_ids(result: Any, model: Any) -> list[int]:
    """A chat's first answer as tokens of its second turn: up to its first end-of-text."""
    tokens = result.tokens[0].tolist()
    stop = next((i for i, t in enumerate(tokens) if t in model.eos_token_ids), len(tokens))
    return tokens[:stop]


def _phase(model: Any, tokenizer: Any, config: DecodeConfig, o: SharedPrefixOptions,
           bodies: list[dict[str, Any]], texts: list[str], prefix: bool) -> dict[str, Any]:
    engine = Engine(model, tokenizer, max_batch_size=o.max_batch,
                    prefix_cache_bytes=o.prefix_cache_bytes if prefix else 0)
    settings = Settings(model_id=o.model, config=config, max_tokens=max(o.gen_length, 1024))
    state = ServerState(EngineWorker(engine, threads=o.threads), settings, Limits(max_queue=len(bodies)))
    warm = [{"model": o.model, "prompt": [5, 6, 7], "stream": True}] * 2      # shares no block
    with background(state) as url:
        load_clients(url, warm, 1)
        cpu = time.process_time()                 # the server's threads (the clients run apart)
        run = load_clients(url, bodies, o.clients)
        cpu = time.process_time() - cpu
    results = run["results"]
    ok = [r for r in results if r["status"] == 200]
    first = sorted(r["first_token_seconds"] for r in ok)
    latency = sorted(r["seconds"] for r in ok)
    out = {"answered": len(ok), "failed": len(results) - len(ok),
           "different_from_offline": sum(r["status"] == 200 and r["text"] != t for r, t in zip(results, texts)),
           "wall_seconds": round(run["wall_seconds"], 3),
           "requests_per_second": round(len(ok) / run["wall_seconds"], 3),
           "server_cpu_seconds": round(cpu, 3), "requests_per_cpu_second": round(len(ok) / cpu, 3),
           "ttft_p50": round(quantile(first, 0.5), 4), "ttft_p99": round(quantile(first, 0.99), 4),
           "latency_p50": round(quantile(latency, 0.5), 4),
           "cached_tokens": sum(r.get("cached_tokens", 0) for r in ok)}
    if engine.prefix is not None:
        out["store"] = engine.prefix.stats().to_dict()
    return out


def _rate(phases: list[dict[str, Any]], pair: int, mode: str, figure: str = "requests_per_second") -> float:
    return next(p[figure] for p in phases if p["pair"] == pair and p["prefix_cache"] == mode)


def format_shared_prefix(report: dict[str, Any]) -> str:
    lines = [f"shared-prefix serving: {report['model']}, {report['requests']} requests "
             f"({report['single_turn']} single-turn, {report['chats']} two-turn chats), system prompt "
             f"{report['prefix_tokens']} tokens (mean prompt {report['prompt_tokens_mean']}), "
             f"{report['clients']} clients, max batch {report['max_batch']}, prefix cache budget "
             f"{report['prefix_cache_bytes']} bytes",
             f"offline one at a time: {report['offline_requests_per_second']} req/s",
             f"{'pair':>4} {'cache':>5} {'ok':>4} {'diff':>4} {'req/s':>7} {'ttft p50':>9} {'ttft p99':>9} "
             f"{'lat p50':>8} {'cpu s':>7} {'req/cpu s':>9} {'cached tok':>10} {'store bytes':>11}"]
    for p in report["phases"]:
        store = p.get("store", {}).get("resident_bytes", "-")
        lines.append(f"{p['pair'] + 1:>4} {p['prefix_cache']:>5} {p['answered']:>4} {p['different_from_offline']:>4} "
                     f"{p['requests_per_second']:>7} {p['ttft_p50']:>9} {p['ttft_p99']:>9} {p['latency_p50']:>8} "
                     f"{p['server_cpu_seconds']:>7} {p['requests_per_cpu_second']:>9} "
                     f"{p['cached_tokens']:>10} {store:>11}")
    low, high = report["speedup_range"]
    lines.append(f"requests/s with / without the prefix cache: {', '.join(map(str, report['speedup']))} "
                 f"(range {low}-{high}x); tokens identical to offline: {'yes' if report['identical'] else 'NO'}")
    low, high = report["cpu_speedup_range"]
    lines.append(f"requests per server CPU second, with / without: {', '.join(map(str, report['cpu_speedup']))} "
                 f"(range {low}-{high}x)")
    return "\n".join(lines)
