"""`report.md`: the summary as markdown tables (leaderboard, per configuration, per task) with
links to the plots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "defaults"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def render(summary: dict[str, Any], plots: Sequence[Path] = (), order_plots: Sequence[Path] = ()) -> str:
    """The report text; `plots` and the decode-order heatmaps `order_plots` are linked by file
    name (they sit next to the report)."""
    lines = [f"# Evaluation: {summary.get('model', 'model')}", ""]
    if summary.get("command"):
        lines += ["```", summary["command"], "```", ""]
    lengths = "/".join(str(g) for g in summary.get("gen_lengths", []))
    lines += [f"{summary['num_samples']} samples, {len(summary['configurations'])} "
              f"configuration(s), {len(summary['tasks'])} task(s)"
              + (f", generation length {lengths}" if lengths else "") + f". Accuracy in %. Speed: answer "
              f"tokens (up to the first end-of-text) per forward pass, the primary axis (an AR "
              f"run's tokens per target forward are the same unit); beside it ParallelBench's "
              f"canvas tokens per step (canvas length / NFE, end-of-text padding included).", ""]
    for message in summary.get("skipped", []):
        lines.append(f"* {message}")
    if summary.get("skipped"):
        lines.append("")
    if summary.get("notice"):
        lines += [f"*{summary['notice']}*", ""]
    for path in [*plots, *order_plots]:          # speed-quality, then each task's decode order
        lines += [f"![{path.stem}]({path.name})", ""]
    levels = list(summary["leaderboard"][0]["pb"]) if summary["leaderboard"] else []
    lines += ["## Speed at mean accuracy", "",
              "PBx: the most answer tokens per forward at >= x% mean accuracy (ParallelBench's "
              "leaderboard rule on the answer-token axis); AUP: d3LLM's accuracy under "
              "parallelism on the same axis; last columns: ParallelBench's own figure on canvas "
              "tokens per step.", ""]
    lines += _table(["sweep", "swept", *(f"PB{lv}" for lv in levels), "AUP",
                     *(f"canvas >= {lv}%" for lv in levels), "interpolated"], [
        [e["label"], ", ".join(e["swept"]) or "–", *(_num(e["pb"][lv], 2) for lv in levels),
         _num(e["aup"], 1), *(_num(e["max_tokens_per_step"][lv], 2) for lv in levels),
         "yes" if e["interpolated"] else "no"]
        for e in summary["leaderboard"]])
    lines += ["", "## Configurations", ""]
    lines += _table(["scheduler", "params", "mean accuracy", "answer tok/fwd", "canvas tok/step",
                     "NFE", "s/sample"], [
        [c["scheduler"], _params(c["params"]), _num(c["mean_accuracy"]),
         _num(c["answer_tokens_per_step"], 2), _num(c["tokens_per_step"], 2), _num(c["nfe"]),
         _num(c["seconds"], 3)] for c in summary["configurations"]])
    if summary.get("oracle"):
        lines += ["", "## Oracle (best sweep point per sample, ParallelBench App. G.2)", ""]
        lines += _table(["sweep", "mean accuracy", "answer tok/fwd", "canvas tok/step"], [
            [o["label"], _num(o["mean_accuracy"]), _num(o["answer_tokens_per_step"], 2),
             _num(o["tokens_per_step"], 2)] for o in summary["oracle"]])
    theory = any(c.get("theory_accuracy") is not None for c in summary["results"])
    lines += ["", "## Per task", ""]
    header = ["task", "scheduler", "params", "accuracy", "answer tok/fwd", "canvas tok/step", "NFE",
              "s/sample"]
    lines += _table(header + (["ideal (theory)", "theory kind"] if theory else []), [
        [c["task"], c["scheduler"], _params(c["params"]), _num(c["accuracy"]),
         _num(c["answer_tokens_per_step"], 2), _num(c["tokens_per_step"], 2), _num(c["nfe"]),
         _num(c["seconds"], 3),
         *([_num(c.get("theory_accuracy")), c.get("theory_kind") or "–"] if theory else [])]
        for c in summary["results"]])
    lines += _order_section(summary, order_plots)
    lines += ["", "## Tasks: conditional total correlation C(Y|X)", ""]
    lines += _table(["task", "examples", "C(Y|X) bits"], [
        [task, str(info["examples"]), _num(info["total_correlation_bits"], 3)]
        for task, info in summary["tasks"].items()])
    return "\n".join(lines) + "\n"


def _order_section(summary: dict[str, Any], order_plots: Sequence[Path]) -> list[str]:
    """Generation order per task and configuration (AFP, Kendall's tau) and the heatmaps; no
    section when no sample recorded its order (AR and captured runs)."""
    cells = [c for c in summary["results"] if c.get("afp") is not None]
    if not cells:
        return []
    lines = ["", "## Generation order", "",
             "AFP (average finalization parallelism, arXiv 2601.15593): answer positions / distinct "
             "steps that finalised them (1: one token a step; higher: more in parallel). Kendall's tau "
             "between position and finalising step (1: strictly left to right, 0: no order, -1: right "
             "to left). Means over the samples; the decode-order heatmaps (`order-<task>.png`) are "
             "drawn beside the speed-quality plots above.", ""]
    lines += _table(["task", "scheduler", "params", "AFP", "Kendall tau"], [
        [c["task"], c["scheduler"], _params(c["params"]), _num(c["afp"], 2), _num(c.get("kendall_tau"), 2)]
        for c in cells])
    return lines


def write_report(summary: dict[str, Any], out_dir: str | Path, plots: Sequence[Path] = (),
                 order_plots: Sequence[Path] = ()) -> Path:
    from dllm_decode.outputs import atomic_write

    path = Path(out_dir) / "report.md"
    atomic_write(path, render(summary, plots, order_plots), "report")
    return path


PLOTS_SKIPPED = ("plots skipped: matplotlib is not installed (pip install \"dllm-decode[plot]\", "
                 "or -e \".[plot]\" in a checkout)")


def write_outputs(records: Sequence[dict[str, Any]], out_dir: str | Path, *, theory: bool = False,
                  skipped: Sequence[str] = (), meta: dict[str, Any] | None = None,
                  plots: bool = True) -> dict[str, Any]:
    """`summary.json`, the plots and `report.md` for a grid's records; returns the summary.

    Without matplotlib no plot is drawn and the summary's `notice` says so (the CLI prints it)."""
    import json

    from dllm_decode.eval.harness.plots import available, plot_summary
    from dllm_decode.eval.harness.summary import summarize

    out = Path(out_dir)
    summary = summarize(records, theory=theory, skipped=skipped, meta=meta)
    summary["gen_lengths"] = sorted({int(r["gen_length"]) for r in records
                                     if isinstance(r.get("gen_length"), int)})
    paths = plot_summary(summary, out) if plots else []
    from dllm_decode.eval.harness.order_plots import plot_order

    orders = plot_order(records, out) if plots else []
    summary["plots"] = [p.name for p in paths]
    summary["order_plots"] = [p.name for p in orders]
    if plots and not available():
        summary["notice"] = PLOTS_SKIPPED
    from dllm_decode.outputs import atomic_write

    atomic_write(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n", "summary")
    write_report(summary, out, paths, orders)
    return summary
