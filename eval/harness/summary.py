"""`summary.json` from the per-sample records: per (configuration, task) accuracy and speed, per
configuration means, and ParallelBench's leaderboard figure "max tokens per step at >= X% mean
accuracy" (spec parallelbench.md §3.1).

Every number here is recomputed from `samples.jsonl`, so a summary never disagrees with its samples.
Accuracy is in percent; tokens per step is the canvas length / NFE, averaged over samples (per
task) and then over tasks (per configuration), like ParallelBench's average curve.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from dllm_decode.eval.theory.formulas import (THEORY_TASKS, fixed_step_partition, ideal_accuracy, task_total_correlation,
                         threshold_partition)

LEVELS = (80.0, 75.0, 70.0)
DISCRETE_KEYS = ("tokens_per_step", "steps_per_block")
"""Sweeps over these are top-k style: the leaderboard reports the largest tested point that holds
the level (ParallelBench: "top-k entries are reported at the largest tested k"); other sweeps are
interpolated linearly along the mean-accuracy curve, as its adaptive-method entries are."""


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def max_tps_at(points: Sequence[tuple[float, float]], level: float, interpolate: bool) -> float:
    """Largest tokens per step whose accuracy is >= `level` along a curve of (tps, accuracy %).

    With `interpolate`, a segment that falls through the level contributes its linear crossing,
    e.g. (3.42, 83.8) -> (4.53, 77.5) gives 4.09 at 80%. 0 when no point reaches the level.
    """
    ordered = sorted(points)
    best = max((t for t, a in ordered if a >= level), default=0.0)
    if interpolate:
        for (t1, a1), (t2, a2) in zip(ordered, ordered[1:]):
            if a1 >= level > a2 and t2 > t1:
                best = max(best, t1 + (a1 - level) * (t2 - t1) / (a1 - a2))
    return best


def theory_point(record: dict[str, Any]) -> tuple[float, float] | None:
    """(tokens per step, accuracy 0-1) of the paper's ideal model for this sample's setting, or
    None without a closed form: the task must be Shuffle or Replace Random, the canvas exactly the
    n answer items in one block, the scheduler fixed-step (any ranking) or a greedy threshold.
    Shuffle is scored as ParallelBench scores it (a permutation other than the input)."""
    task = record["task"].removeprefix("released/")
    n, gen = record.get("n"), record["gen_length"]
    if task not in THEORY_TASKS or n is None or gen != n or record["block_length"] != gen:
        return None
    scheduler, sampled = record["config"]["scheduler"], record["config"]["temperature"] > 0
    if "tokens_per_step" in scheduler:
        partition = fixed_step_partition(n, math.ceil(gen / scheduler["tokens_per_step"]))
    elif "steps_per_block" in scheduler:
        partition = fixed_step_partition(n, scheduler["steps_per_block"] or gen)
    elif scheduler["name"] == "threshold" and not sampled:
        partition = threshold_partition(task, n, scheduler["threshold"])
    else:
        return None
    accuracy = ideal_accuracy(task, partition, sampled)
    if accuracy is not None and task == "shuffle":
        # ParallelBench's scorer rejects the identity; by symmetry a decoded permutation is
        # uniform, so it is the identity 1/n! of the time.
        accuracy *= 1 - 1 / math.factorial(n)
    return None if accuracy is None else (gen / len(partition), accuracy)


def summarize(records: Sequence[dict[str, Any]], *, theory: bool = False,
              skipped: Sequence[str] = (), levels: Sequence[float] = LEVELS,
              meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary of a grid's records (see the module docstring).

    Args:
        records: samples, in plan order (`dllm_decode.eval.harness.runner.evaluate`).
        theory: add the ideal model's closed-form accuracy where one exists (ideal model runs).
        skipped: messages about tasks left out.
        levels: accuracy levels (percent) of the leaderboard figure.
        meta: extra top-level fields (model, command, ...).
    """
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        cells.setdefault((record["config_key"], record["task"]), []).append(record)
    results = [_cell(rows, theory) for rows in cells.values()]
    configurations = _configurations(results)
    return {
        **(meta or {}),
        "results": results,
        "configurations": configurations,
        "leaderboard": _leaderboard(configurations, levels),
        "oracle": _oracles(records),
        "tasks": _tasks(records),
        "skipped": list(skipped),
        "num_samples": len(records),
    }


def _cell(rows: list[dict[str, Any]], theory: bool) -> dict[str, Any]:
    first = rows[0]
    cell = {
        "task": first["task"], "scheduler": first["scheduler"], "params": first["params"],
        "label": first["label"], "config_key": first["config_key"], "group": first["group"],
        "swept": first["swept"], "model": first["model"], "samples": len(rows),
        "accuracy": 100 * _mean(r["score"] for r in rows),
        "nfe": _mean(r["nfe"] for r in rows),
        "tokens_per_step": _mean(r["tokens_per_step"] for r in rows),
        "answer_tokens_per_step": _mean(r["answer_tokens_per_step"] for r in rows),
        "seconds": _mean(r["seconds"] for r in rows),
    }
    if theory:
        points = [theory_point(r) for r in rows]
        ok = all(p is not None for p in points)
        cell["theory_accuracy"] = 100 * _mean(p[1] for p in points) if ok else None
        cell["theory_tokens_per_step"] = _mean(p[0] for p in points) if ok else None
    return cell


def _configurations(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_key: dict[str, list[dict[str, Any]]] = {}
    for cell in results:
        by_key.setdefault(cell["config_key"], []).append(cell)
    out = []
    for key, cells in by_key.items():
        first = cells[0]
        out.append({
            "config_key": key, "group": first["group"], "scheduler": first["scheduler"],
            "params": first["params"], "label": first["label"], "swept": first["swept"],
            "model": first["model"],
            "tasks": len(cells), "samples": sum(c["samples"] for c in cells),
            "mean_accuracy": _mean(c["accuracy"] for c in cells),
            "tokens_per_step": _mean(c["tokens_per_step"] for c in cells),
            "answer_tokens_per_step": _mean(c["answer_tokens_per_step"] for c in cells),
            "nfe": _mean(c["nfe"] for c in cells),
            "seconds": _mean(c["seconds"] for c in cells),
        })
    return out


def _leaderboard(configurations: list[dict[str, Any]], levels: Sequence[float]) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for config in configurations:
        groups.setdefault(config["group"], []).append(config)
    out = []
    for group, configs in groups.items():
        swept = configs[0]["swept"]
        interpolate = not any(k in DISCRETE_KEYS for k in swept)
        points = [(c["tokens_per_step"], c["mean_accuracy"]) for c in configs]
        out.append({
            "group": group, "scheduler": configs[0]["scheduler"], "label": configs[0]["label"],
            "model": configs[0]["model"], "swept": swept, "interpolated": interpolate,
            "points": [{"tokens_per_step": t, "mean_accuracy": a} for t, a in sorted(points)],
            "max_tokens_per_step": {f"{level:g}": max_tps_at(points, level, interpolate)
                                    for level in levels},
        })
    return out


def _oracles(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """ParallelBench's oracle (App. G.2) along each sweep: per sample, the sweep point with the best
    score and, among those, the most tokens per step; then averaged like a configuration."""
    groups: dict[str, dict[tuple[str, int], list[dict[str, Any]]]] = {}
    for record in records:
        if record["swept"]:
            groups.setdefault(record["group"], {}).setdefault(
                (record["task"], record["index"]), []).append(record)
    out = []
    for group, samples in groups.items():
        if len({r["config_key"] for rows in samples.values() for r in rows}) < 2:
            continue
        per_task: dict[str, list[dict[str, Any]]] = {}
        for (task, _), rows in samples.items():
            per_task.setdefault(task, []).append(max(rows, key=lambda r: (r["score"], r["tokens_per_step"])))
        tasks = {task: {"accuracy": 100 * _mean(r["score"] for r in best),
                        "tokens_per_step": _mean(r["tokens_per_step"] for r in best)}
                 for task, best in per_task.items()}
        first = next(iter(samples.values()))[0]
        out.append({"group": group, "label": first["label"], "scheduler": first["scheduler"],
                    "tasks": tasks, "mean_accuracy": _mean(t["accuracy"] for t in tasks.values()),
                    "tokens_per_step": _mean(t["tokens_per_step"] for t in tasks.values())})
    return out


def _tasks(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: samples per configuration and the mean conditional total correlation C(Y|X)."""
    out: dict[str, dict[str, Any]] = {}
    seen: set[tuple[str, int]] = set()
    values: dict[str, list[float | None]] = {}
    for record in records:
        if (record["task"], record["index"]) in seen:
            continue
        seen.add((record["task"], record["index"]))
        values.setdefault(record["task"], []).append(task_total_correlation(record["task"], record.get("n")))
    for task, bits in values.items():
        known = None if any(b is None for b in bits) else _mean(bits)
        out[task] = {"examples": len(bits), "total_correlation_bits": known}
    return out
