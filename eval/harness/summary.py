"""`summary.json` from the per-sample records: per (configuration, task) accuracy and speed, per
configuration means, and the speed-quality figures of each sweep (ParallelBench's metrics).

Every number here is recomputed from `samples.jsonl`, so a summary never disagrees with its samples.
Accuracy is in percent. Speed has two units, each averaged over samples (per task) and then over
tasks (per configuration), like ParallelBench's average curve:

* answer tokens per forward (`answer_tokens_per_step`, the primary axis): tokens up to the first
  end-of-text divided by the forward passes (NFE). An AR run's tokens per target forward are the
  same unit, so dLLM and AR points share every combined axis.
* canvas tokens per step (`tokens_per_step`): ParallelBench's figure, the canvas length / NFE,
  end-of-text padding included (dLLMs only; threshold 0.9 at gen 32 may show 19 canvas tokens per
  step for 3 answer tokens).

Per sweep: PBx, the most answer tokens per forward at >= x% mean accuracy (ParallelBench's
leaderboard rule, Kang et al. 2025, arXiv 2510.04767, on the answer-token axis), the same on the
canvas axis (`max_tokens_per_step`, ParallelBench's own number), and d3LLM's AUP (Qian et al.
2026, arXiv 2601.07568): the quality-weighted area under accuracy against answer tokens per
forward.

Generation order per (configuration, task), where the samples recorded it (a dLLM decoded with
the eager step): AFP and Kendall's tau of the order positions were finalised in (arXiv
2601.15593, `dllm_decode.viz.order`), averaged over samples (tau over the samples where defined).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from dllm_decode.eval.theory.formulas import task_total_correlation
from dllm_decode.eval.theory.overlay import record_point

LEVELS = (80.0, 75.0, 70.0)
DISCRETE_KEYS = ("tokens_per_step", "steps_per_block")
"""Sweeps over these are top-k style: the leaderboard reports the largest tested point that holds
the level (ParallelBench: "top-k entries are reported at the largest tested k"); other sweeps are
interpolated linearly along the mean-accuracy curve, as its adaptive-method entries are."""
AUP_ALPHA = 3.0
AUP_OFFSET = 5.0
"""d3LLM's AUP defaults: the weight's penalty factor and the accuracy drop (points) kept."""


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def _present_mean(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are there (None when none is: an AR run, an old record)."""
    kept = [v for v in values if v is not None]
    return _mean(kept) if kept else None


def max_tps_at(points: Sequence[tuple[float, float]], level: float, interpolate: bool) -> float:
    """Largest speed whose accuracy is >= `level` along a curve of (speed, accuracy %).

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


def aup(points: Sequence[tuple[float, float]], y_max: float, alpha: float = AUP_ALPHA,
        offset: float = AUP_OFFSET) -> float:
    """d3LLM's Accuracy Under Parallelism of a curve of (parallelism, accuracy %) points.

    Sorted by parallelism rho, with y_1 the accuracy of the least parallel point, the points with
    accuracy >= y_1 - `offset` are kept; AUP = rho_1 y_1 + sum_i (rho_i - rho_{i-1}) (y_i W(y_i) +
    y_{i-1} W(y_{i-1})) / 2 with W(y) = min(exp(-alpha (1 - y / y_max)), 1), `y_max` the best
    accuracy among the methods compared. 0 for an empty curve or y_max <= 0.
    """
    if not points or y_max <= 0:
        return 0.0
    ordered = sorted(points, key=lambda p: p[0])
    kept = [(r, y) for r, y in ordered if y >= ordered[0][1] - offset]

    def weighted(y: float) -> float:
        return y * min(math.exp(-alpha * (1 - y / y_max)), 1.0)

    total = kept[0][0] * kept[0][1]
    for (r0, y0), (r1, y1) in zip(kept, kept[1:]):
        total += 0.5 * (r1 - r0) * (weighted(y1) + weighted(y0))
    return total


def theory_point(record: dict[str, Any]) -> tuple[float, float] | None:
    """(answer tokens per forward, accuracy 0-1) of the ideal model for this sample's setting, or
    None (see `dllm_decode.eval.theory.overlay.record_point`)."""
    point = record_point(record)
    return None if point is None else (point.tokens_per_step, point.accuracy)


def summarize(records: Sequence[dict[str, Any]], *, theory: bool = False,
              skipped: Sequence[str] = (), levels: Sequence[float] = LEVELS,
              meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary of a grid's records (see the module docstring).

    Args:
        records: samples, in plan order (`dllm_decode.eval.harness.runner.evaluate`).
        theory: add the ideal model's accuracy where it is known, closed form or exact
            (`dllm_decode.eval.theory.overlay`; ideal model runs).
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
        "forward_rows": _mean(r.get("forward_rows", r["nfe"]) for r in rows),
        "guide_nfe": _mean(r.get("guide_nfe", 0) for r in rows),
        "tokens_per_step": _mean(r["tokens_per_step"] for r in rows),
        "answer_tokens_per_step": _mean(r["answer_tokens_per_step"] for r in rows),
        "seconds": _mean(r["seconds"] for r in rows),
        "afp": _present_mean(r.get("afp") for r in rows),
        "kendall_tau": _present_mean(r.get("kendall_tau") for r in rows),
    }
    if theory:
        points = [record_point(r) for r in rows]
        ok = all(p is not None for p in points)
        cell["theory_accuracy"] = 100 * _mean(p.accuracy for p in points) if ok else None
        cell["theory_tokens_per_step"] = _mean(p.tokens_per_step for p in points) if ok else None
        cell["theory_kind"] = " + ".join(sorted({p.kind for p in points})) if ok else None
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
            "forward_rows": _mean(c.get("forward_rows", c["nfe"]) for c in cells),
            "guide_nfe": _mean(c.get("guide_nfe", 0) for c in cells),
            "seconds": _mean(c["seconds"] for c in cells),
        })
    return out


def _leaderboard(configurations: list[dict[str, Any]], levels: Sequence[float]) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for config in configurations:
        groups.setdefault(config["group"], []).append(config)
    y_max = max((c["mean_accuracy"] for c in configurations if not math.isnan(c["mean_accuracy"])),
                default=0.0)
    out = []
    for group, configs in groups.items():
        swept = configs[0]["swept"]
        interpolate = not any(k in DISCRETE_KEYS for k in swept)
        configs = sorted(configs, key=lambda c: (c["answer_tokens_per_step"], c["tokens_per_step"]))
        answer = [(c["answer_tokens_per_step"], c["mean_accuracy"]) for c in configs]
        canvas = [(c["tokens_per_step"], c["mean_accuracy"]) for c in configs]
        out.append({
            "group": group, "scheduler": configs[0]["scheduler"], "label": configs[0]["label"],
            "model": configs[0]["model"], "swept": swept, "interpolated": interpolate,
            "points": [{"answer_tokens_per_step": c["answer_tokens_per_step"],
                        "tokens_per_step": c["tokens_per_step"], "mean_accuracy": c["mean_accuracy"],
                        "params": {k: c["params"].get(k) for k in swept}} for c in configs],
            "pb": {f"{level:g}": max_tps_at(answer, level, interpolate) for level in levels},
            "aup": aup(answer, y_max),
            "max_tokens_per_step": {f"{level:g}": max_tps_at(canvas, level, interpolate)
                                    for level in levels},
        })
    return out


def _oracles(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """ParallelBench's oracle (App. G.2) along each sweep: per sample, the sweep point with the best
    score and, among those, the fewest forward passes; then averaged like a configuration."""
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
            per_task.setdefault(task, []).append(max(rows, key=lambda r: (r["score"], -r["nfe"])))
        tasks = {task: {"accuracy": 100 * _mean(r["score"] for r in best),
                        "answer_tokens_per_step": _mean(r["answer_tokens_per_step"] for r in best),
                        "tokens_per_step": _mean(r["tokens_per_step"] for r in best)}
                 for task, best in per_task.items()}
        first = next(iter(samples.values()))[0]
        out.append({"group": group, "label": first["label"], "scheduler": first["scheduler"],
                    "model": first["model"], "tasks": tasks,
                    "mean_accuracy": _mean(t["accuracy"] for t in tasks.values()),
                    "answer_tokens_per_step": _mean(t["answer_tokens_per_step"] for t in tasks.values()),
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
