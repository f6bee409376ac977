"""Accuracy per task group and format, with intervals, from the eval runs of run_eval.sh.

    python measurements/cpu_2026-11-29_quant/summarize.py > measurements/cpu_2026-11-29_quant/accuracy.md
    python measurements/cpu_2026-11-29_quant/summarize.py measure   # tables of measure.json

Per (model, threshold, format, group): mean score in % with its 95% Wilson interval, and the
paired difference from bf16 on the same prompts with its 95% half-width (normal approximation,
`eval.tune.search.paired`); then the paired difference of the two int4 calibrations.
"""

from __future__ import annotations

import json
from pathlib import Path

from dllm_decode.eval.tasks.sources import GROUPS
from dllm_decode.eval.tune.search import paired, wilson

HERE = Path(__file__).parent / "eval"
FORMATS = ("bf16", "int8", "fp8", "int4-rtn", "int4-clean", "int4-decode")
GROUP_OF = {task: group for group in ("waiting_line", "puzzles") for task in GROUPS[group]}


def scores(label: str) -> dict[tuple[float, str], dict[str, float]]:
    """(threshold, group) -> {task|index: score}, from the run's samples.jsonl (kept out of git;
    `run_eval.sh` remakes it) condensed into the committed scores.json beside it."""
    folder = HERE / label
    samples, condensed = folder / "samples.jsonl", folder / "scores.json"
    if samples.is_file():
        flat = {}
        for line in samples.read_text().splitlines():
            row = json.loads(line)
            threshold = row["decode_config"]["scheduler"]["threshold"]
            flat[f"{threshold}|{row['task']}|{row['index']}"] = float(row["score"])
        condensed.write_text(json.dumps(flat, sort_keys=True) + "\n")
    flat = json.loads(condensed.read_text())
    out: dict[tuple[float, str], dict[str, float]] = {}
    for key, score in flat.items():
        threshold, task, index = key.split("|")
        out.setdefault((float(threshold), GROUP_OF[task]), {})[f"{task}|{index}"] = score
    return out


def main() -> None:
    print("| model | threshold | group | n | " + " | ".join(FORMATS) + " |")
    print("|---|---|---|---|" + "---|" * len(FORMATS))
    for model in ("embedded", "embedded-bd"):
        runs = {fmt: scores(f"{model}-{fmt}") for fmt in FORMATS
                if any((HERE / f"{model}-{fmt}" / n).is_file() for n in ("samples.jsonl", "scores.json"))}
        if not runs.get("bf16"):
            continue
        for (threshold, group), base in sorted(runs["bf16"].items(), key=lambda kv: (-kv[0][0], kv[0][1])):
            cells = []
            for fmt in FORMATS:
                got = runs.get(fmt, {}).get((threshold, group))
                if not got:
                    cells.append("-")
                    continue
                keys = sorted(set(got) & set(base))
                k, n = sum(got[key] for key in keys), len(keys)
                low, high = 100 * wilson(k, n, -1.96), 100 * wilson(k, n, 1.96)
                cell = f"{100 * k / n:.1f} [{low:.1f}, {high:.1f}]"
                if fmt != "bf16":
                    drop, half = paired([got[key] for key in keys], [base[key] for key in keys])
                    cell += f"<br>{0.0 - drop + 0.0:+.1f} ± {half:.1f}"
                cells.append(cell)
            print(f"| {model} | {threshold:g} | {group} | {len(base)} | " + " | ".join(cells) + " |")
    print()
    print("Calibration from decodes against calibration on clean text (int4-decode - int4-clean, "
          "paired, points, 95% half-width):")
    print()
    print("| model | threshold | group | n | decode - clean |")
    print("|---|---|---|---|---|")
    for model in ("embedded", "embedded-bd"):
        try:
            decode, clean = scores(f"{model}-int4-decode"), scores(f"{model}-int4-clean")
        except FileNotFoundError:
            continue
        for cell in sorted(decode, key=lambda c: (-c[0], c[1])):
            keys = sorted(set(decode[cell]) & set(clean.get(cell, {})))
            if not keys:
                continue
            drop, half = paired([decode[cell][k] for k in keys], [clean[cell][k] for k in keys])
            print(f"| {model} | {cell[0]:g} | {cell[1]} | {len(keys)} | "
                  f"{0.0 - drop + 0.0:+.1f} ± {half:.1f} |")


def measure_tables() -> None:
    data = json.loads((HERE.parent / "measure.json").read_text())
    print(f"Forward time: median (fastest) of {data['rounds']} interleaved rounds, one thread; "
          f"x = multiple of the bf16 reference-runtime model's time.")
    print()
    print("| model | format | weight bytes | x bf16 | resident tensor bytes | batch 1 ms (fastest) "
          "| x bf16 | batch 8 ms (fastest) | x bf16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in ("embedded", "embedded-bd"):
        for fmt, row in data[model].items():
            print(f"| {model} | {fmt} | {row['weight_bytes']:,} | {row['x_bf16']:.3f} | "
                  f"{row['resident_bytes']:,} | {row['ms_b1']:.1f} ({row['min_ms_b1']:.1f}) | "
                  f"{row['x_bf16_b1']:.2f} ({row['min_x_bf16_b1']:.2f}) | {row['ms_b8']:.1f} "
                  f"({row['min_ms_b8']:.1f}) | {row['x_bf16_b8']:.2f} ({row['min_x_bf16_b8']:.2f}) |")
    print()
    print("| one 4096 x 4096 linear | batch 1 ms (fastest) | x bf16 | batch 32 ms (fastest) | x bf16 |")
    print("|---|---|---|---|---|")
    for fmt, row in data["linear_4096"].items():
        print(f"| {fmt} | {row['ms_b1']:.2f} ({row['min_ms_b1']:.2f}) | {row['x_bf16_b1']:.2f} "
              f"({row['min_x_bf16_b1']:.2f}) | {row['ms_b32']:.1f} ({row['min_ms_b32']:.1f}) | "
              f"{row['x_bf16_b32']:.2f} ({row['min_x_bf16_b32']:.2f}) |")


if __name__ == "__main__":
    import sys

    measure_tables() if sys.argv[1:] == ["measure"] else main()
