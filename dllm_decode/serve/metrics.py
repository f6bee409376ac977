"""`GET /metrics`: the server's counters in Prometheus' text exposition format (version 0.0.4),
written by hand (a few counters do not justify a dependency).

Series (all prefixed `dllm_`): `requests_total{path,status}`, `requests_in_flight`,
`queue_depth` (admitted, waiting for a batch row), `prompt_tokens_total`,
`completion_tokens_total`, `nfe_total` (model forward passes), `request_seconds` (a latency
histogram of every HTTP request) and `decode_seconds` (of finished decodes, queueing included).
With the prefix cache on (`serve --prefix-cache-bytes`): `prefix_cache_hits_total`,
`prefix_cache_misses_total` (admitted requests with and without reused blocks),
`prefix_cache_reused_tokens_total`, `prefix_cache_restored_tokens_total`,
`prefix_cache_inserted_total`, `prefix_cache_evicted_total` (blocks), `prefix_cache_entries`,
`prefix_cache_resident_bytes` and `prefix_cache_budget_bytes` (`prefix_reuse.PrefixStats`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Histogram upper bounds in seconds (`+Inf` is added)."""
KNOWN_PATHS = ("/health", "/metrics", "/openapi.json", "/v1/models", "/v1/completions",
               "/v1/chat/completions")
"""Paths counted under their own label; every other path counts as `other` (bounded labels)."""


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        index = next((i for i, bound in enumerate(BUCKETS) if seconds <= bound), len(BUCKETS))
        self.counts[index] += 1
        self.total += seconds

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*map(str, BUCKETS), "+Inf"), self.counts):
            running += count
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        out += [f"{name}_sum {self.total:.6f}", f"{name}_count {running}"]
        return out


class Metrics:
    """Counters shared by the event loop and the guard (a lock keeps the text consistent)."""

    def __init__(self, in_flight: Callable[[], int] = lambda: 0, queued: Callable[[], int] = lambda: 0,
                 prefix: Callable[[], Any] = lambda: None):
        self.in_flight, self.queued, self.prefix = in_flight, queued, prefix
        self.lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = self.completion_tokens = self.nfe = 0
        self.request_seconds, self.decode_seconds = Histogram(), Histogram()

    def count_request(self, path: str, status: int, seconds: float) -> None:
        with self.lock:
            self.requests[(path if path in KNOWN_PATHS else "other", int(status))] += 1
            self.request_seconds.observe(seconds)

    def count_decode(self, prompt_tokens: int, completion_tokens: int, nfe: int, seconds: float) -> None:
        with self.lock:
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens
            self.nfe += nfe
            self.decode_seconds.observe(seconds)

    def text(self) -> str:
        """The exposition text."""
        with self.lock:
            lines = ["# HELP dllm_requests_total HTTP requests answered, by path and status.",
                     "# TYPE dllm_requests_total counter"]
            lines += [f'dllm_requests_total{{path="{path}",status="{status}"}} {count}'
                      for (path, status), count in sorted(self.requests.items())]
            gauges = (("requests_in_flight", "Requests admitted and not yet answered.", self.in_flight()),
                      ("queue_depth", "Requests admitted and waiting for a batch row.", self.queued()))
            for name, doc, value in gauges:
                lines += [f"# HELP dllm_{name} {doc}", f"# TYPE dllm_{name} gauge", f"dllm_{name} {value}"]
            counters = (("prompt_tokens_total", "Prompt tokens of finished requests.", self.prompt_tokens),
                        ("completion_tokens_total", "Answer tokens returned.", self.completion_tokens),
                        ("nfe_total", "Model forward passes of finished requests.", self.nfe))
            for name, doc, value in counters:
                lines += [f"# HELP dllm_{name} {doc}", f"# TYPE dllm_{name} counter", f"dllm_{name} {value}"]
            for name, doc, hist in (("request_seconds", "HTTP request latency.", self.request_seconds),
                                    ("decode_seconds", "Decode latency, queueing included.",
                                     self.decode_seconds)):
                lines += [f"# HELP dllm_{name} {doc}", f"# TYPE dllm_{name} histogram", *hist.lines(f"dllm_{name}")]
            lines += prefix_lines(self.prefix())
        return "\n".join(lines) + "\n"


PREFIX_SERIES = (("hits", "counter", "Requests admitted with reused prefix blocks."),
                 ("misses", "counter", "Requests admitted with no reused block."),
                 ("reused_tokens", "counter", "Prompt tokens of admitted requests whose K/V were reused."),
                 ("restored_tokens", "counter", "Columns restored from the store, re-admissions included."),
                 ("inserted", "counter", "Blocks stored."),
                 ("evicted", "counter", "Blocks evicted to stay under the budget."),
                 ("entries", "gauge", "Blocks held."),
                 ("resident_bytes", "gauge", "Bytes of the K/V held."),
                 ("budget_bytes", "gauge", "The most bytes the K/V may take."))


def prefix_stats(engine: Any) -> Any:
    """An engine's `PrefixStats`, or None when it has no prefix cache (a causal LM's, or off)."""
    sharing = getattr(engine, "prefix", None)
    return None if sharing is None else sharing.stats()


def prefix_lines(stats: Any) -> list[str]:
    """The prefix cache's series (none when it is off)."""
    if stats is None:
        return []
    values, lines = stats.to_dict(), []
    for field, kind, doc in PREFIX_SERIES:
        name = f"dllm_prefix_cache_{field}" + ("_total" if kind == "counter" else "")
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name} {values[field]}"]
    return lines
