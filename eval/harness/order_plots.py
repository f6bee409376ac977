"""Decode-order heatmaps: per task, for each configuration, how often each canvas position
(x) was finalised at each step (y), over the task's samples. Dark on the diagonal is
left-to-right; a wide band is parallel; a sweep from both ends is another order. Read from the
samples' `finalized_at` (the eager step records it; captured and AR runs have none)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAX_PANELS = 6
"""Configurations drawn per task (the first in plan order); more would be too small to read."""


def order_matrix(rows: Sequence[Sequence[int]]) -> list[list[float]]:
    """(steps, positions) share of the samples that finalised position p at step s."""
    width = max(len(r) for r in rows)
    height = max(max(r) for r in rows)
    counts = [[0.0] * width for _ in range(height)]
    for finalized in rows:
        for p, step in enumerate(finalized):
            counts[step - 1][p] += 1.0 / len(rows)
    return counts


def order_panels(records: Sequence[dict[str, Any]]) -> dict[str, list[tuple[str, list[list[float]]]]]:
    """Per task, per configuration (plan order, at most `MAX_PANELS`): (label, matrix)."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for record in records:
        if record.get("finalized_at"):
            grouped.setdefault(record["task"], {}).setdefault(record["config_key"], []).append(record)
    return {task: [(rows[0]["label"], order_matrix([r["finalized_at"] for r in rows]))
                   for rows in list(configs.values())[:MAX_PANELS]]
            for task, configs in grouped.items()}


def file_name(task: str) -> str:
    """`order-<task>.png`, the task name made safe for a file name."""
    return "order-" + re.sub(r"[^A-Za-z0-9._-]+", "_", task) + ".png"


def plot_order(records: Sequence[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """One PNG per task with recorded orders; their paths (none without matplotlib)."""
    from dllm_decode.eval.harness.plots import _pyplot, available

    if not available():
        return []
    plt = _pyplot()
    paths = []
    for task, panels in order_panels(records).items():
        cols = len(panels)
        fig, axes = plt.subplots(1, cols, figsize=(3.3 * cols + 0.8, 3.4), squeeze=False)
        image = None
        for ax, (label, matrix) in zip(axes.flat, panels):
            image = ax.imshow(matrix, aspect="auto", origin="lower", cmap="viridis", vmin=0.0, vmax=1.0,
                              interpolation="nearest", extent=(-0.5, len(matrix[0]) - 0.5, 0.5, len(matrix) + 0.5))
            ax.set_title(label, fontsize=8, wrap=True)
            ax.set_xlabel("canvas position", fontsize=8)
            ax.set_ylabel("step finalised", fontsize=8)
            ax.tick_params(labelsize=7)
        fig.colorbar(image, ax=list(axes.flat), shrink=0.85, label="share of samples")
        fig.suptitle(f"decode order · {task}", fontsize=10)
        path = Path(out_dir) / file_name(task)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
