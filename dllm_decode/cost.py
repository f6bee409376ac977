"""What one request may cost a step, estimated from its decode record before it is admitted.

A step of the loop runs the model over each row's canvas (prompt + generation); a rule with a
look-ahead (`lookahead_candidates`, Info-Gain's `candidates`) or a guide model adds canvas rows
per row. The step then holds logits, probabilities and the rule's float32 working copies of
shape (rows, canvas, vocabulary). `request_cost` counts both; the server refuses a request whose
estimate is over its budget (`serve --max-request-bytes`) with a 400 naming the option that
scales it, so no single request can stall the engine or exhaust its memory. Every option that
scales a step also has an upper bound in its type (`fields.bounded`), checked wherever the
component is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from dllm_decode.fields import MAX_CANVAS, scaling_fields  # noqa: F401 - MAX_CANVAS re-exported

def _cores() -> int:
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


CORES = _cores()
"""CPU cores this process may run on: the most threads a command starts (more only thrash, and
far more fail to start)."""
MAX_ROWS = 4096
"""The most batch rows a server decodes at once (`serve --max-concurrent`) and requests it keeps
waiting (`--max-queue` is at most 16x that): each row holds a canvas and its cache, so the count
is bounded like every other one."""
MAX_PROMPTS = 100_000
"""The most prompts per task an evaluation or a tuning split takes (`eval --limit`, `tune
--calibration/--held-out`, `select_tasks(limit=)`): the task generators are cheap, but a count of
10^8 would never return."""
DEFAULT_REQUEST_BYTES = 8 << 30
"""The server's default budget of one request's step (8 GiB)."""
STEP_COPIES = 3
"""(rows, canvas, vocabulary) float32 tensors a step holds at once: logits, probabilities and a
rule's working copy (entropies, look-ahead scores)."""


class Cost(NamedTuple):
    """One request row's step: canvas `rows` forwarded, `tokens` per row, estimated `bytes`, and
    the option (a dotted path under the scheduler, e.g. `candidates`) that multiplies the rows."""

    rows: int
    tokens: int
    bytes: int
    option: str


class OverBudget(ValueError):
    """A request whose estimated step is over the budget; `option` names what scales it."""

    def __init__(self, message: str, option: str):
        super().__init__(message)
        self.option = option


def request_cost(config: Any, prompt_length: int, vocab_size: int) -> Cost:
    """The estimated step of one request row under `config` (a `DecodeConfig`)."""
    scheduler = config.scheduler
    rows = 1 + int(getattr(scheduler, "lookahead_candidates", 0) or 0) + (1 if getattr(scheduler, "guide", None) else 0)
    tokens = int(prompt_length) + int(config.gen_length)
    return Cost(rows, tokens, rows * tokens * int(vocab_size) * 4 * STEP_COPIES, _rows_option(scheduler))


def _rows_option(component: Any, prefix: str = "") -> str:
    """The dotted field (through wrapped components) that scales forward rows, or ""."""
    if not dataclasses.is_dataclass(component):
        return ""
    for name in scaling_fields(type(component), "rows"):
        if getattr(component, name, 0) not in (0, 1):
            return prefix + name
    for field in dataclasses.fields(component):
        inner = getattr(component, field.name)
        if dataclasses.is_dataclass(inner) and not isinstance(inner, type):
            found = _rows_option(inner, f"{prefix}{field.name}.")
            if found:
                return found
    return ""


def check_budget(config: Any, prompt_length: int, vocab_size: int, budget: int) -> Cost:
    """The request's cost, or `OverBudget` naming the option that scales it (the canvas,
    `gen_length`, when no option multiplies the rows).

    Raises:
        OverBudget: the estimate is over `budget` bytes.
    """
    cost = request_cost(config, prompt_length, vocab_size)
    if cost.bytes > budget:
        option = f"dllm.scheduler.{cost.option}" if cost.option else "dllm.gen_length"
        raise OverBudget(f"this request's step would need about {size(cost.bytes)} ({cost.rows} canvas "
                         f"row(s) of {cost.tokens} tokens over {vocab_size} vocabulary entries), over "
                         f"this server's budget of {size(budget)} per request; lower "
                         f"{option.removeprefix('dllm.')}", option)
    return cost


def size(count: int) -> str:
    """Bytes in words: `1.5 GiB`, `12.0 MiB`, `300 B`."""
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << power:
            return f"{count / (1 << power):.1f} {unit}"
    return f"{count} B"
