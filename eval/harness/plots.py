"""Speed-quality plots (matplotlib, Agg; the optional `[plot]` extra): accuracy against tokens per
step, overall and per task, one line per sweep, oracle and AR points marked, and the ideal
model's closed-form accuracy as dashed lines beside the measured points when present."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

OVERALL = "accuracy_vs_tokens_per_step.png"
PER_TASK = "tasks_accuracy_vs_tokens_per_step.png"


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _is_ar(model: str) -> bool:
    return model.startswith("ar:")


def plot_summary(summary: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write the overall and per-task PNGs; returns their paths (none without matplotlib)."""
    if not available() or not summary["results"]:
        return []
    out = Path(out_dir)
    return [_overall(summary, out / OVERALL), _per_task(summary, out / PER_TASK)]


def _style(index: int) -> dict[str, Any]:
    markers = "osD^v<>ph"
    return {"color": f"C{index % 10}", "marker": markers[index % len(markers)]}


def _overall(summary: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, entry in enumerate(summary["leaderboard"]):
        points = [(p["tokens_per_step"], p["mean_accuracy"]) for p in entry["points"]]
        ar = _is_ar(entry.get("model", ""))
        style = _style(i) | ({"marker": "X", "markersize": 9} if ar else {})
        ax.plot(*zip(*points), label=("AR+spec " if ar else "") + entry["label"], linewidth=1.6,
                **style)
    for i, oracle in enumerate(summary.get("oracle", [])):
        ax.plot(oracle["tokens_per_step"], oracle["mean_accuracy"], marker="*", markersize=14,
                linestyle="none", color=_style(i)["color"], markeredgecolor="black",
                label=f"oracle ({oracle['label']})")
    _axes(ax, "mean over tasks")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _per_task(summary: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    tasks = list(dict.fromkeys(cell["task"] for cell in summary["results"]))
    cols = min(4, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False)
    groups = list(dict.fromkeys(cell["group"] for cell in summary["results"]))
    labels = {cell["group"]: cell["label"] for cell in summary["results"]}
    for ax, task in zip(axes.flat, tasks):
        for i, group in enumerate(groups):
            cells = sorted((c for c in summary["results"] if c["task"] == task and c["group"] == group),
                           key=lambda c: c["tokens_per_step"])
            if not cells:
                continue
            style = _style(i)
            ax.plot([c["tokens_per_step"] for c in cells], [c["accuracy"] for c in cells],
                    markersize=4, linewidth=1.3, label=labels[group], **style)
            theory = sorted((c["theory_tokens_per_step"], c["theory_accuracy"]) for c in cells
                            if c.get("theory_accuracy") is not None)
            if theory:
                ax.plot(*zip(*theory), linestyle="--", marker=style["marker"], markersize=5,
                        markerfacecolor="none", color=style["color"], linewidth=1.0,
                        label=f"theory ({labels[group]})")
        for i, oracle in enumerate(summary.get("oracle", [])):
            if task in oracle["tasks"]:
                point = oracle["tasks"][task]
                ax.plot(point["tokens_per_step"], point["accuracy"], marker="*", markersize=10,
                        linestyle="none", color=_style(groups.index(oracle["group"]))["color"]
                        if oracle["group"] in groups else "black", markeredgecolor="black")
        bits = summary.get("tasks", {}).get(task, {}).get("total_correlation_bits")
        _axes(ax, task + (f"  (C={bits:.2f} bits)" if bits is not None else ""), small=True)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    for ax in list(axes.flat)[1:len(tasks)]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            if name not in names:
                handles.append(handle)
                names.append(name)
    fig.legend(handles, names, loc="lower center", ncol=min(3, len(names)), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.025 * math.ceil(len(names) / 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _axes(ax, title: str, small: bool = False) -> None:
    ax.set_title(title, fontsize=9 if small else 11)
    ax.set_xlabel("tokens per step", fontsize=8 if small else 10)
    ax.set_ylabel("accuracy (%)", fontsize=8 if small else 10)
    ax.set_ylim(-3, 103)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    if not small:
        ax.legend(fontsize=8)
