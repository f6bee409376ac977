"""Rules side by side from an eval folder: PB80, NFE at equal accuracy and coupling adaptivity.

`python -m dllm_decode.eval.tune.compare DIR [DIR ...] [--limit N] [--reference low_confidence]`
reads every `samples.jsonl` under the folders (one or more `dllm-decode eval` runs on the same
prompts), keeps each task's first N prompts, and writes `side_by_side.md` and `.json` into the
first folder. Per rule (a `dllm-decode eval` curve: scheduler plus its fixed options):

* PB80: the most answer tokens per forward at >= 80% mean accuracy over the tasks, interpolated
  along the rule's sweep (`summary.max_tps_at`, ParallelBench's leaderboard rule on the answer
  axis), and the same on ParallelBench's canvas axis.
* NFE at equal accuracy: the fewest mean forwards per prompt among the rule's points whose mean
  accuracy, on exactly the prompts the reference decoded, is at least the reference's minus 1
  point (one token per step: `low_confidence` at its defaults); "-" when none is. Per task too.
* Coupling adaptivity: mean forwards per answer token on the coupled tasks (C > 0: shuffle,
  insert/replace/remove random, Latin square) over the same on the C = 0 tasks, at the rule's
  point used for NFE at equal accuracy (or its default point). A fixed schedule sits near 1 and
  loses accuracy on the coupled tasks; an adaptive rule spends more forwards where answers couple.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from dllm_decode.eval.harness.records import read_records, unique_by_key
from dllm_decode.eval.harness.summary import max_tps_at
from dllm_decode.outputs import atomic_write

COUPLED = ("shuffle", "insert_random", "replace_random", "remove_random", "latin_square")
SLACK = 1.0
"""Points below the reference's accuracy still counted as equal accuracy."""


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def load(folders: Sequence[Path], limit: int | None) -> list[dict[str, Any]]:
    """Every sample under the folders, once per key, each task cut to its first `limit` prompts."""
    records = unique_by_key(r for folder in folders for path in sorted(Path(folder).rglob("samples.jsonl"))
                            for r in read_records(path))
    return [r for r in records if limit is None or r["index"] < limit]


def _point(rows: list[dict[str, Any]], prompts: set[tuple[str, int]] | None = None) -> dict[str, Any]:
    """Task means, then the mean over tasks (as `summary`), on `prompts` when given."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if prompts is None or (r["task"], r["index"]) in prompts:
            by_task[r["task"]].append(r)
    tasks = {t: {"n": len(rs), "accuracy": 100 * _mean([r["score"] for r in rs]),
                 "nfe": _mean([r["nfe"] for r in rs]),
                 "answer_tokens_per_forward": _mean([r["answer_tokens_per_step"] for r in rs]),
                 "canvas_tokens_per_step": _mean([r["tokens_per_step"] for r in rs])} for t, rs in by_task.items()}
    mean = {k: _mean([v[k] for v in tasks.values()]) for k in ("accuracy", "nfe", "answer_tokens_per_forward",
                                                                "canvas_tokens_per_step")}
    return {**mean, "n": sum(v["n"] for v in tasks.values()), "tasks": tasks}


def side_by_side(records: list[dict[str, Any]], reference: str = "low_confidence") -> dict[str, Any]:
    """The per-rule table (see the module docstring)."""
    points: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    labels: dict[str, str] = {}
    for r in records:
        points[r["group"]][r["config_key"]].append(r)
        labels[r["group"]] = r["label"]
    ref_group = next((g for g, label in labels.items() if label == reference
                      and all(not rs[0]["params"] for rs in points[g].values())), None)
    if ref_group is None:
        raise ValueError(f"no {reference} run at its defaults among the samples: it is the reference")
    ref_rows = next(iter(points[ref_group].values()))
    prompts = {(r["task"], r["index"]) for r in ref_rows}
    ref = _point(ref_rows)
    rows = []
    for group, configs in points.items():
        figures = []
        for rs in configs.values():
            whole, paired = _point(rs), _point(rs, prompts)
            figures.append({"params": rs[0]["params"], "whole": whole, "paired": paired})
        curve = [(f["whole"]["answer_tokens_per_forward"], f["whole"]["accuracy"]) for f in figures]
        canvas = [(f["whole"]["canvas_tokens_per_step"], f["whole"]["accuracy"]) for f in figures]
        swept = bool(records and any(rs[0]["swept"] for rs in configs.values()))
        ok = [f for f in figures if f["paired"]["n"] == ref["n"] and f["paired"]["accuracy"] >= ref["accuracy"] - SLACK]
        best = min(ok, key=lambda f: f["paired"]["nfe"]) if ok else None
        shown = best or min(figures, key=lambda f: len(f["params"]))
        per_task = {}
        for task in ref["tasks"]:
            held = [f for f in figures if task in f["paired"]["tasks"]
                    and f["paired"]["tasks"][task]["n"] == ref["tasks"][task]["n"]
                    and f["paired"]["tasks"][task]["accuracy"] >= ref["tasks"][task]["accuracy"] - SLACK]
            per_task[task] = min(f["paired"]["tasks"][task]["nfe"] for f in held) if held else None
        rows.append({"rule": labels[group], "points": len(figures), "n": max(f["whole"]["n"] for f in figures),
                     "accuracy": shown["whole"]["accuracy"],
                     "pb80": max_tps_at(curve, 80.0, True), "pb80_canvas": max_tps_at(canvas, 80.0, True),
                     "nfe_at_equal_accuracy": best["paired"]["nfe"] if best else None,
                     "at": best["params"] if best else None, "swept": swept,
                     "nfe_at_equal_accuracy_per_task": per_task,
                     "coupling_ratio": _coupling(shown["paired"]["tasks"])})
    rows.sort(key=lambda row: (row["nfe_at_equal_accuracy"] is None, row["nfe_at_equal_accuracy"] or 0, -row["pb80"]))
    return {"reference": {"rule": reference, "accuracy": ref["accuracy"], "nfe": ref["nfe"], "n": ref["n"]},
            "slack_points": SLACK, "rules": rows}


def _coupling(tasks: dict[str, dict[str, Any]]) -> float | None:
    """Forwards per answer token on the coupled tasks over the same on the C = 0 tasks."""
    def per_token(names: list[str]) -> float:
        return _mean([1 / tasks[t]["answer_tokens_per_forward"] for t in names if tasks[t]["answer_tokens_per_forward"]])
    coupled = [t for t in tasks if t in COUPLED]
    free = [t for t in tasks if t not in COUPLED]
    if not coupled or not free:
        return None
    return per_token(coupled) / per_token(free)


def render(table: dict[str, Any], command: str) -> str:
    """`side_by_side.md`: the per-rule rows, best NFE at equal accuracy first."""
    ref = table["reference"]
    lines = [f"Reference: {ref['rule']} (one token per step) {ref['accuracy']:.1f}% at NFE {ref['nfe']:.2f} on "
             f"n = {ref['n']} prompts; equal accuracy = at least {ref['accuracy'] - table['slack_points']:.1f}% "
             f"on the same prompts.", "", f"Command: `{command}`", "",
             "| rule | points | n | accuracy % (at) | PB80 answer tok/fwd | PB80 canvas tok/step | NFE at equal accuracy | "
             "at | coupled / C=0 forwards per token |", "|---|---|---|---|---|---|---|---|---|"]
    for row in table["rules"]:
        nfe = "-" if row["nfe_at_equal_accuracy"] is None else f"{row['nfe_at_equal_accuracy']:.2f}"
        at = "-" if row["at"] is None else (json.dumps(row["at"]) if row["at"] else "defaults")
        ratio = "-" if row["coupling_ratio"] is None else f"{row['coupling_ratio']:.2f}"
        lines.append(f"| {row['rule']} | {row['points']} | {row['n']} | {row['accuracy']:.1f} | {row['pb80']:.2f} | "
                     f"{row['pb80_canvas']:.1f} | "
                     f"{nfe} | {at} | {ratio} |")
    tasks = list(next(iter(table["rules"]))["nfe_at_equal_accuracy_per_task"]) if table["rules"] else []
    lines += ["", "NFE at equal accuracy per task (- : no point of the rule holds the reference's accuracy there):",
              "", "| rule | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for row in table["rules"]:
        cells = [("-" if v is None else f"{v:.2f}") for v in row["nfe_at_equal_accuracy_per_task"].values()]
        lines.append(f"| {row['rule']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@click.command("compare")
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--limit", type=click.IntRange(1), default=None, help="First N prompts per task.")
@click.option("--reference", default="low_confidence", show_default=True, help="The one-token-per-step rule.")
def main(folders: tuple[Path, ...], limit: int | None, reference: str) -> None:
    """Rules side by side from eval folders: PB80, NFE at equal accuracy, coupling adaptivity."""
    try:
        table = side_by_side(load(folders, limit), reference)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    command = shlex.join(["python", "-m", "dllm_decode.eval.tune.compare", *sys.argv[1:]])
    atomic_write(folders[0] / "side_by_side.json", json.dumps(table, indent=1) + "\n")
    atomic_write(folders[0] / "side_by_side.md", render(table, command))
    click.echo(render(table, command))


if __name__ == "__main__":
    main()
