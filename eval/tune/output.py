"""The tuner's files: `presets.json` (one preset per task plus `overall`, loadable by name),
`tune.json` (every evaluated point) and `report.md` (the per-task table)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from dllm_decode import __version__
from dllm_decode.eval.harness.grid import Setting
from dllm_decode.eval.tune.tuner import Outcome


def parts(setting: Setting, gen_length: int) -> dict[str, Any]:
    """The preset's `DecodeConfig.from_dict` keys: scheduler, cache, filters and the block length
    it was tuned at (`tokens_per_step` resolved to `steps_per_block` at `gen_length`). On
    answer-length canvases (`gen_length` 0) the block is the whole canvas and a fixed-count rule's
    `tokens_per_step` is kept beside the parts, since its step count depends on each canvas."""
    own = setting.to_dict().get("self_decoder")
    own = {} if own is None else {"self_decoder": own}         # a self-decoder decodes the record
    if gen_length:
        record = setting.decode_config(gen_length).to_dict()
        return {**{key: record[key] for key in ("scheduler", "cache", "filters", "block_length")}, **own}
    record = setting.to_dict()
    scheduler = dict(record["scheduler"])
    tokens_per_step = scheduler.pop("tokens_per_step", None)
    out = {"scheduler": scheduler, "cache": record["cache"], "filters": record["filters"], **own}
    return out if tokens_per_step is None else {**out, "tokens_per_step": tokens_per_step}


def write(outcome: Outcome, out: Path, *, model: dict[str, str], command: str, gen_length: int) -> dict[str, Any]:
    """Write presets.json, tune.json and report.md under `out`; return the presets document."""
    stamp = {"model": model, "budget": str(outcome.budget), "command": command,
             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "version": __version__}
    presets: dict[str, Any] = {}
    for task in outcome.tasks:
        point = outcome.per_task[task]
        setting = point.setting if point is not None else outcome.reference
        presets[task] = _entry(outcome, setting, [task], f"task:{task}" if point else "reference", gen_length)
    if outcome.overall is not None:
        presets["overall"] = _entry(outcome, outcome.overall, outcome.tasks, "overall", gen_length)
    document = {**stamp, "grid": sorted({p.setting.label() + " " + json.dumps(p.setting.params(), sort_keys=True)
                                         for p in outcome.points}),
                "presets": presets}
    out.mkdir(parents=True, exist_ok=True)
    (out / "presets.json").write_text(json.dumps(document, indent=1, default=str) + "\n")
    (out / "tune.json").write_text(json.dumps({**stamp, "points": [p.row() for p in outcome.points],
                                               "held_out": outcome.held_out,
                                               "search_forwards": outcome.search_forwards,
                                               "reference_forwards": outcome.reference_forwards,
                                               "sweep_forwards": outcome.sweep_forwards,
                                               "sweep_best": outcome.sweep_best}, indent=1, default=str) + "\n")
    (out / "report.md").write_text(report(outcome, model, command))
    return document


def _entry(outcome: Outcome, setting: Setting, tasks: list[str], name: str, gen_length: int) -> dict[str, Any]:
    calibration = [p for p in outcome.points if p.setting == setting and p.task in tasks]
    return {"parts": parts(setting, gen_length), "label": setting.label(), "params": setting.params(),
            "calibration": {p.task: {"n": outcome.sizes[p.task][0], "accuracy": p.accuracy, "delta": p.delta,
                                     "nfe": p.nfe} for p in calibration},
            "held_out": {t: outcome.held_out.get(name, {}).get(t) for t in tasks}}


def report(outcome: Outcome, model: dict[str, str], command: str) -> str:
    """The per-task table: chosen preset, calibration and held-out accuracy, Δ with its 95%
    interval, NFE and speed-up over one token per step; then the overall preset and the best
    single threshold."""
    lines = [f"# dllm-decode tune: {model['name']}", "", f"Command: `{command}`", "",
             f"Budget {outcome.budget} against one token per step (`low_confidence`, no cache). "
             f"One prompt is 100/n points.", "",
             "| task | preset | n cal / held | cal acc | cal Δ | held acc | held Δ (95%) | held NFE | speed-up | meets |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for task in outcome.tasks:
        point = outcome.per_task[task]
        name = f"task:{task}" if point else "reference"
        held = outcome.held_out.get(name, {}).get(task) or {}
        label = (point.setting.label() + " " + json.dumps(point.setting.params())) if point else "reference (nothing faster met the budget)"
        cal_n, held_n = outcome.sizes[task]
        lines.append(f"| {task} | {label} | {cal_n} / {held_n} | {point.accuracy if point else float('nan'):.1f} | "
                     f"{point.delta if point else 0.0:+.1f} | {held.get('accuracy', float('nan')):.1f} | "
                     f"{held.get('delta', float('nan')):+.1f} ± {held.get('delta_ci95', float('nan')):.1f} | "
                     f"{held.get('nfe', float('nan')):.2f} | {held.get('speedup', float('nan')):.2f}x | "
                     f"{'yes' if held.get('meets') else 'NO'} |")
    for name, setting in (("overall", outcome.overall), ("best_threshold", outcome.best_threshold)):
        lines += ["", f"## {name}: " + (f"{setting.label()} {json.dumps(setting.params())}" if setting else
                                        "no single setting met the budget on every task")]
        if setting is None:
            continue
        if not outcome.held_out.get(name):
            lines += ["", "(not checked on the held-out prompts)"]
            continue
        lines += ["", "| task | held acc | held Δ (95%) | held NFE | speed-up | meets |", "|---|---|---|---|---|---|"]
        for task, f in outcome.held_out.get(name, {}).items():
            lines.append(f"| {task} | {f['accuracy']:.1f} | {f['delta']:+.1f} ± {f['delta_ci95']:.1f} | "
                         f"{f['nfe']:.2f} | {f['speedup']:.2f}x | {'yes' if f['meets'] else 'NO'} |")
    means = []
    for name in ("reference", "overall", "best_threshold"):
        figures = outcome.held_out.get(name)
        if figures:
            means.append(f"{name} {sum(f['nfe'] for f in figures.values()) / len(figures):.2f}")
    per_task = [outcome.held_out.get(f"task:{t}" if outcome.per_task[t] else "reference", {}).get(t) for t in outcome.tasks]
    if all(per_task):
        means.insert(0, f"per-task presets {sum(f['nfe'] for f in per_task) / len(per_task):.2f} "
                        f"({sum(f['meets'] for f in per_task)} of {len(per_task)} meet the budget)")
    lines += ["", "Mean held-out NFE over the tasks: " + ", ".join(means) + "."]
    lines += ["", f"Search forwards on the calibration split: {outcome.search_forwards} (the reference's own, "
                  f"one token per step, apart: {outcome.reference_forwards})."]
    if outcome.sweep_forwards is not None:
        lines.append(f"Exhaustive sweep over the same grid (reference apart): {outcome.sweep_forwards} forwards "
                     f"(search / sweep = {outcome.search_forwards / max(1, outcome.sweep_forwards):.1%}); "
                     f"its best single global setting: {outcome.sweep_best or 'none met the budget'}.")
    return "\n".join(lines) + "\n"
