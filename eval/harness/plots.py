"""Speed-quality plots (matplotlib, Agg; the optional `[plot]` extra).

The primary axis is answer tokens (up to the first end-of-text) per forward pass, the unit dLLM
and AR points share; the overall figure puts ParallelBench's canvas tokens per step beside it
(dLLM curves only: an AR run has no canvas). One line per sweep, each point labelled with its
swept value, oracle and AR points marked, and per task the ideal model's accuracy as dashed lines
beside the measured points when present, labelled with the kind of number it is (closed form or
exact enumeration, `dllm_decode.eval.theory.overlay`).

A reader needs nothing else to read them: each figure is titled with the model, the generation
length(s) and the sample count; the accuracy axis is fitted to the data (with a margin), the x
axis leaves room for the rightmost point (AR points included); every kind of marker (sweeps,
oracle stars, AR crosses, ideal-model lines) has a legend entry; and the per-task grid says in a
caption what its `C=... bits` (the task's conditional total correlation) means.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

OVERALL = "accuracy_vs_speed.png"
PER_TASK = "tasks_accuracy_vs_answer_tokens_per_forward.png"
ANSWER_AXIS = "answer tokens per forward"
CANVAS_AXIS = "canvas tokens per step (ParallelBench)"
SHORT_KEYS = {"tokens_per_step": "k", "threshold": "τ", "temperature": "T", "factor": "f",
              "gamma": "γ", "block_length": "block", "steps_per_block": "steps"}
"""Point labels: short names for the usual sweep keys (others keep their own)."""


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


def series_label(model: str, label: str) -> str:
    """A legend entry. An AR run says so and names its rule as what it is, the draft-length
    rule (`AR ar_target+ar_draft (draft length: threshold)`), so it is never read as a dLLM
    threshold sweep beside it."""
    if not _is_ar(model):
        return label
    rule = label[len(model):].strip() if label.startswith(model) else label
    return f"AR {model[3:]} (draft length: {rule})" if rule else f"AR {model[3:]}"


def point_label(params: dict[str, Any], swept: list[str]) -> str:
    """The text beside a sweep point: its swept values, `k=2`, `τ=0.9, T=1`."""
    def show(value: Any) -> str:
        return f"{value:g}" if isinstance(value, float) else str(value)
    return ", ".join(f"{SHORT_KEYS.get(k, k)}={show(params.get(k))}" for k in swept)


COUPLING_CAPTION = ("C = the task's conditional total correlation C(Y|X) in bits: how strongly the "
                    "answer's tokens depend on each other given the prompt. At C = 0 committing many "
                    "tokens per step costs nothing; the larger C, the more parallel commits cost "
                    "accuracy (ParallelBench).")


def plot_summary(summary: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write the overall and per-task PNGs; returns their paths (none without matplotlib)."""
    if not available() or not summary["results"]:
        return []
    out = Path(out_dir)
    return [_save(overall_figure(summary), out / OVERALL, 120), _save(per_task_figure(summary), out / PER_TASK, 110)]


def _save(fig, path: Path, dpi: int) -> Path:
    fig.savefig(path, dpi=dpi)
    _pyplot().close(fig)
    return path


def title(summary: dict[str, Any]) -> str:
    """`model · gen 32 · 216 samples`: what a figure shows, from the summary."""
    parts = [str(summary.get("model") or "model")]
    lengths = summary.get("gen_lengths") or []
    if lengths:
        parts.append("gen " + "/".join(str(g) for g in lengths))
    parts.append(f"{summary.get('num_samples', 0)} samples")
    return " · ".join(parts)


def accuracy_limits(values: list[float]) -> tuple[float, float]:
    """The y range: the data's span (at least 10 points) plus 10%, centred on the data and kept
    inside [-3, 103], so a band of 80-100% is not squashed into the top fifth of a 0-100 axis."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return -3.0, 103.0
    lo, hi = min(finite), max(finite)
    half = 1.1 * max(hi - lo, 10.0) / 2
    middle = (lo + hi) / 2
    return max(middle - half, -3.0), min(middle + half, 103.0)


def speed_limit(values: list[float]) -> float:
    """The x axis's right end: 8% past the rightmost point, so no marker sits on the frame."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return 1.08 * max(finite) if finite else 1.0


def _style(index: int) -> dict[str, Any]:
    markers = "osD^v<>ph"
    return {"color": f"C{index % 10}", "marker": markers[index % len(markers)]}


def _annotate(ax, xs: list[float], ys: list[float], labels: list[str], color: str) -> None:
    """Queue point labels; `_place_labels` draws them once the axes' limits are final."""
    queued = ax.__dict__.setdefault("_dllm_labels", [])
    queued += [(x, y, text, color) for x, y, text in zip(xs, ys, labels) if text]


LABEL_OFFSETS = ((4, 4), (4, -10), (-4, 4), (-4, -10), (4, 12), (4, -18))
"""Where a point's label may go (points from the marker, tried in order; negative x: to its left)."""


def _place_all(fig) -> None:
    """Every panel's point labels, placed after the layout has fixed where the panels are."""
    for ax in fig.axes:
        _place_labels(ax)


def _place_labels(ax, fontsize: float = 6.0) -> None:
    """Draw the queued labels where none overlaps another (a label that fits nowhere is left out:
    the legend and report.md's tables carry every value)."""
    fig = ax.figure
    scale = 72.0 / fig.dpi                                    # display pixels -> points
    taken: list[tuple[float, float, float, float]] = []
    for x, y, text, color in ax.__dict__.pop("_dllm_labels", []):
        px, py = (v * scale for v in ax.transData.transform((x, y)))
        width, height = 0.65 * fontsize * len(text) + 1, fontsize + 2
        for dx, dy in LABEL_OFFSETS:
            left = px + dx - (width if dx < 0 else 0)
            box = (left, py + dy, left + width, py + dy + height)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in taken):
                taken.append(box)
                ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                            color=color, ha="right" if dx < 0 else "left")
                break


def overall_figure(summary: dict[str, Any]):
    """Mean accuracy against answer tokens per forward (left) and canvas tokens per step
    (right), one line per sweep; the matplotlib figure (not saved)."""
    plt = _pyplot()
    fig, (answer_ax, canvas_ax) = plt.subplots(1, 2, figsize=(11.5, 4.9), sharey=True)
    ys: list[float] = []
    xs_answer: list[float] = []
    xs_canvas: list[float] = []
    for i, entry in enumerate(summary["leaderboard"]):
        ar = _is_ar(entry.get("model", ""))
        style = _style(i) | ({"marker": "X", "markersize": 9} if ar else {})
        label = series_label(entry.get("model", ""), entry["label"])
        points = entry["points"]
        names = [point_label(p.get("params", {}), entry["swept"]) for p in points]
        accuracy = [p["mean_accuracy"] for p in points]
        xs = [p["answer_tokens_per_step"] for p in points]
        answer_ax.plot(xs, accuracy, label=label, linewidth=1.6, **style)
        _annotate(answer_ax, xs, accuracy, names, style["color"])
        ys += accuracy
        xs_answer += xs
        if not ar:
            xs = [p["tokens_per_step"] for p in points]
            xs_canvas += xs
            canvas_ax.plot(xs, accuracy, label=label, linewidth=1.6, **style)
            _annotate(canvas_ax, xs, accuracy, names, style["color"])
    for i, oracle in enumerate(summary.get("oracle", [])):
        star = {"marker": "*", "markersize": 14, "linestyle": "none", "color": _style(i)["color"],
                "markeredgecolor": "black"}
        answer_ax.plot(oracle["answer_tokens_per_step"], oracle["mean_accuracy"],
                       label=f"oracle: best point per sample ({oracle['label']})", **star)
        ys.append(oracle["mean_accuracy"])
        xs_answer.append(oracle["answer_tokens_per_step"])
        if not _is_ar(oracle.get("model", "")):
            canvas_ax.plot(oracle["tokens_per_step"], oracle["mean_accuracy"],
                           label=f"oracle: best point per sample ({oracle['label']})", **star)
            xs_canvas.append(oracle["tokens_per_step"])
    limits = accuracy_limits(ys)
    _axes(answer_ax, "mean over tasks", ANSWER_AXIS, limits=limits, right=speed_limit(xs_answer))
    _axes(canvas_ax, "mean over tasks (dLLM canvas; AR has none)", CANVAS_AXIS, limits=limits,
          right=speed_limit(xs_canvas))
    fig.suptitle(title(summary), fontsize=12)
    fig.tight_layout()
    _place_all(fig)
    return fig


def per_task_figure(summary: dict[str, Any]):
    """One panel per task (accuracy against answer tokens per forward), a shared legend and the
    coupling caption; the matplotlib figure (not saved)."""
    plt = _pyplot()
    tasks = list(dict.fromkeys(cell["task"] for cell in summary["results"]))
    cols = min(4, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows + 1.2), squeeze=False)
    groups = list(dict.fromkeys(cell["group"] for cell in summary["results"]))
    labels = {cell["group"]: series_label(cell.get("model", ""), cell["label"]) for cell in summary["results"]}
    for ax, task in zip(axes.flat, tasks):
        seen_y: list[float] = []
        seen_x: list[float] = []
        for i, group in enumerate(groups):
            cells = sorted((c for c in summary["results"] if c["task"] == task and c["group"] == group),
                           key=lambda c: c["answer_tokens_per_step"])
            if not cells:
                continue
            style = _style(i) | ({"marker": "X"} if _is_ar(cells[0].get("model", "")) else {})
            xs, ys = [c["answer_tokens_per_step"] for c in cells], [c["accuracy"] for c in cells]
            seen_x += xs
            seen_y += ys
            ax.plot(xs, ys, markersize=4, linewidth=1.3, label=labels[group], **style)
            _annotate(ax, xs, ys, [point_label(c["params"], c["swept"]) for c in cells], style["color"])
            theory = sorted((c["theory_tokens_per_step"], c["theory_accuracy"], c["theory_kind"])
                            for c in cells if c.get("theory_accuracy") is not None)
            if theory:
                kinds = " + ".join(sorted({kind for _, _, kind in theory}))
                ax.plot([t for t, _, _ in theory], [a for _, a, _ in theory], linestyle="--",
                        marker=style["marker"], markersize=5, markerfacecolor="none",
                        color=style["color"], linewidth=1.0,
                        label=f"ideal model, {kinds} ({labels[group]})")
                seen_x += [t for t, _, _ in theory]
                seen_y += [a for _, a, _ in theory]
        for oracle in summary.get("oracle", []):
            if task in oracle["tasks"]:
                point = oracle["tasks"][task]
                ax.plot(point["answer_tokens_per_step"], point["accuracy"], marker="*", markersize=10,
                        linestyle="none", color=_style(groups.index(oracle["group"]))["color"]
                        if oracle["group"] in groups else "black", markeredgecolor="black",
                        label=f"oracle: best point per sample ({oracle['label']})")
                seen_x.append(point["answer_tokens_per_step"])
                seen_y.append(point["accuracy"])
        bits = summary.get("tasks", {}).get(task, {}).get("total_correlation_bits")
        _axes(ax, task + (f"  (C={bits:.2f} bits)" if bits is not None else ""), ANSWER_AXIS,
              small=True, limits=accuracy_limits(seen_y), right=speed_limit(seen_x))
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    for ax in list(axes.flat)[1:len(tasks)]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            if name not in names:
                handles.append(handle)
                names.append(name)
    legend_rows = math.ceil(len(names) / 3)
    fig.legend(handles, names, loc="lower center", ncol=min(3, len(names)), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 0.035))
    caption = COUPLING_CAPTION if any(
        summary.get("tasks", {}).get(t, {}).get("total_correlation_bits") is not None for t in tasks) else ""
    if caption:
        fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=7, wrap=True)
    fig.suptitle(title(summary) + " · accuracy per task", fontsize=11)
    height = fig.get_figheight()
    bottom = (0.5 + 0.18 * legend_rows + (0.35 if caption else 0.0)) / height
    fig.tight_layout(rect=(0, min(bottom, 0.45), 1, 1))
    _place_all(fig)
    return fig


def _axes(ax, title: str, xlabel: str, small: bool = False,
          limits: tuple[float, float] = (-3.0, 103.0), right: float | None = None) -> None:
    ax.set_title(title, fontsize=9 if small else 11)
    ax.set_xlabel(xlabel, fontsize=8 if small else 10)
    ax.set_ylabel("accuracy (%)", fontsize=8 if small else 10)
    ax.set_ylim(*limits)
    ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= 100 and limits[0] <= t <= limits[1]])
    ax.set_xlim(left=0, right=right)        # (no tick past 100%: the margin above is for markers)
    ax.grid(alpha=0.3)
    if not small and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
