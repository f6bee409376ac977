"""Accuracy and forwards per task group, with intervals, for the runs of run_eval.sh.

    python measurements/cpu_2026-11-29-noise/summarize.py > measurements/cpu_2026-11-29-noise/accuracy.md

Per (run, group): mean score in % with its 95% Wilson interval; forward passes per sample (NFE:
every model call, the noise model's one encoder pass per canvas included) with a 95% normal
half-width; answer tokens per forward. Then the paired difference of each masked run from the
noise model on the same prompts (points, 95% half-width, `eval.tune.search.paired`). It first
checks that the noise run decoded with exactly the model's shipped decoding (`for_model`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dllm_decode.eval.tasks.sources import GROUPS
from dllm_decode.eval.tune.search import paired, wilson

HERE = Path(__file__).parent / "eval"
RUNS = {"noise-shipped": "embedded-noise, shipped (uniform_noise, bound 0.1, 16 steps/canvas)",
        "noise-steps48": "embedded-noise, 48 steps/canvas (the reference's default)",
        "embedded-t0.9": "embedded, shipped (threshold 0.9)",
        "embedded-k1": "embedded, one token per step (low_confidence)"}
GROUP_OF = {task: group for group in ("waiting_line", "puzzles") for task in GROUPS[group]}


def rows(label: str) -> list[dict]:
    return [json.loads(line) for line in (HERE / label / "samples.jsonl").read_text().splitlines()]


def check_shipped(noise_rows: list[dict]) -> None:
    """Raise unless every noise row's decode config is `DecodeConfig.for_model`'s (seed aside)."""
    from dllm_decode import DecodeConfig, load_model

    shipped = DecodeConfig.for_model(load_model("embedded-noise"), gen_length=32).to_dict()
    for row in noise_rows:
        got = {k: v for k, v in row["decode_config"].items() if k != "seed"}
        want = {k: v for k, v in shipped.items() if k != "seed"}
        if got != want:
            raise SystemExit(f"the noise run did not use the shipped decoding: {got} != {want}")


def interval(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)
    return mean, 1.96 * math.sqrt(var / len(values))


def cell(sel: list[dict]) -> str:
    k, n = sum(r["score"] for r in sel), len(sel)
    low, high = 100 * wilson(k, n, -1.96), 100 * wilson(k, n, 1.96)
    nfe, half = interval([float(r["nfe"]) for r in sel])
    answer = sum(r["answer_tokens_per_step"] * r["nfe"] for r in sel) / sum(r["nfe"] for r in sel)
    return f"{n} | {100 * k / n:.1f} [{low:.1f}, {high:.1f}] | {nfe:.2f} ± {half:.2f} | {answer:.2f}"


def main() -> None:
    runs = {label: rows(label) for label in RUNS if (HERE / label / "samples.jsonl").is_file()}
    check_shipped(runs["noise-shipped"])
    print("| run | group | n | accuracy % [95% CI] | NFE per sample ± 95% | answer tokens / forward |")
    print("|---|---|---|---|---|---|")
    for label, got in runs.items():
        for group in ("waiting_line", "puzzles", "all"):
            sel = [r for r in got if group == "all" or GROUP_OF[r["task"]] == group]
            print(f"| {RUNS[label]} | {group} | {cell(sel)} |")
    print()
    print("Paired difference on the same prompts, masked run minus the noise model (points, 95% half-width):")
    print()
    print("| masked run | group | n | accuracy difference | NFE difference |")
    print("|---|---|---|---|---|")
    base = {f"{r['task']}|{r['index']}": r for r in runs["noise-shipped"]}
    for label, got in runs.items():
        if label.startswith("noise-"):
            continue
        for group in ("waiting_line", "puzzles", "all"):
            sel = [r for r in got if (group == "all" or GROUP_OF[r["task"]] == group)
                   and f"{r['task']}|{r['index']}" in base]
            ref = [base[f"{r['task']}|{r['index']}"] for r in sel]
            drop, half = paired([r["score"] for r in ref], [r["score"] for r in sel])
            nfe, nfe_half = interval([float(a["nfe"]) - float(b["nfe"]) for a, b in zip(sel, ref)])
            print(f"| {RUNS[label]} | {group} | {len(sel)} | {drop:+.1f} ± {half:.1f} | {nfe:+.2f} ± {nfe_half:.2f} |")
    print()
    print("Per task (accuracy %, NFE per sample):")
    print()
    print("| task | " + " | ".join(RUNS[label] for label in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for task in GROUP_OF:
        cells = []
        for label, got in runs.items():
            sel = [r for r in got if r["task"] == task]
            cells.append(f"{100 * sum(r['score'] for r in sel) / len(sel):.0f} ({sum(r['nfe'] for r in sel) / len(sel):.1f})")
        print(f"| {task} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
