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


PARTS = ("", "-waiting_line", "-puzzles")
"""A run's folders: one over every task, or one per group (n = 100 per group from 10 prompts per
waiting-line task and 50 per puzzle task); later ones add prompts to (or repeat) earlier ones."""


def _folder_scores(folder: Path) -> dict[str, float]:
    """{threshold|task|index: score} from the run's samples.jsonl (kept out of git; the run_*.sh
    scripts remake it) condensed into the committed scores.json beside it."""
    samples, condensed = folder / "samples.jsonl", folder / "scores.json"
    if samples.is_file():
        flat = {}
        for line in samples.read_text().splitlines():
            row = json.loads(line)
            threshold = row["decode_config"]["scheduler"]["threshold"]
            flat[f"{threshold}|{row['task']}|{row['index']}"] = float(row["score"])
        condensed.write_text(json.dumps(flat, sort_keys=True) + "\n")
    return json.loads(condensed.read_text())


def has_run(label: str) -> bool:
    return any((HERE / f"{label}{part}" / name).is_file() for part in PARTS
               for name in ("samples.jsonl", "scores.json"))


def scores(label: str) -> dict[tuple[float, str], dict[str, float]]:
    """(threshold, group) -> {task|index: score} over the label's folders (`PARTS`)."""
    flat: dict[str, float] = {}
    for part in PARTS:
        folder = HERE / f"{label}{part}"
        if any((folder / name).is_file() for name in ("samples.jsonl", "scores.json")):
            flat.update(_folder_scores(folder))
    if not flat:
        raise FileNotFoundError(label)
    out: dict[tuple[float, str], dict[str, float]] = {}
    for key, score in flat.items():
        threshold, task, index = key.split("|")
        out.setdefault((float(threshold), GROUP_OF[task]), {})[f"{task}|{index}"] = score
    return out


def cell(got: dict[str, float], base: dict[str, float] | None) -> str:
    """Mean in % with its 95% Wilson interval over `got`'s prompts; with `base`, the paired
    difference on the prompts both hold, with its 95% half-width."""
    k, n = sum(got.values()), len(got)
    low, high = 100 * wilson(k, n, -1.96), 100 * wilson(k, n, 1.96)
    text = f"{100 * k / n:.1f} [{low:.1f}, {high:.1f}]"
    if base is not None:
        keys = sorted(set(got) & set(base))
        drop, half = paired([got[key] for key in keys], [base[key] for key in keys])
        text += f"<br>{0.0 - drop + 0.0:+.1f} ± {half:.1f}" + ("" if len(keys) == n else f" (n = {len(keys)})")
    return text


def table(rows: list[tuple[str, str]], columns: dict[str, str]) -> None:
    """One line per (row name, model) x (threshold, group); a column's run label is its template
    with `{m}` the row's model; the first column's run is the baseline of the paired
    differences."""
    print("| model | threshold | group | n | " + " | ".join(columns) + " |")
    print("|---|---|---|---|" + "---|" * len(columns))
    for name, model in rows:
        labels = {col: template.format(m=model) for col, template in columns.items()}
        runs = {col: scores(label) for col, label in labels.items() if has_run(label)}
        first = next(iter(columns))
        if first not in runs:
            continue
        for (threshold, group), base in sorted(runs[first].items(), key=lambda kv: (-kv[0][0], kv[0][1])):
            cells = [cell(runs[col][(threshold, group)], None if col == first else base)
                     if (threshold, group) in runs.get(col, {}) else "-" for col in columns]
            ns = sorted({len(runs[col][(threshold, group)]) for col in runs if (threshold, group) in runs[col]})
            print(f"| {name} | {threshold:g} | {group} | {'/'.join(map(str, ns))} | " + " | ".join(cells) + " |")
    print()


def main() -> None:
    print("## Weight formats\n")
    print("int4 is the integer-zero-point layout (`run_eval_int4.sh`); n per cell, and per paired "
          "difference where fewer prompts are shared with bf16.\n")
    models = [(m, m) for m in ("embedded", "embedded-bd")]
    table(models, {f: f"{{m}}-{f}" for f in FORMATS})
    print("Calibration from decodes against calibration on clean text (int4-decode - int4-clean, "
          "paired, points, 95% half-width):\n")
    table(models, {"clean": "{m}-int4-clean", "decode": "{m}-int4-decode"})
    print("## KV cache (`run_eval_kv.sh`: bf16 weights, dual cache on embedded, block on embedded-bd)\n")
    table([("embedded (dual)", "embedded-dual"), ("embedded-bd (block)", "embedded-bd-block")],
          {"auto (bf16)": "kv-{m}-auto", "fp8": "kv-{m}-fp8", "int8": "kv-{m}-int8"})
    print("## int4 in the previous layout (float16 zero), for reference (`eval/floatzero/`)\n")
    table(models, {"bf16": "{m}-bf16", "int4-rtn": "floatzero/{m}-int4-rtn",
                   "int4-clean": "floatzero/{m}-int4-clean", "int4-decode": "floatzero/{m}-int4-decode"})


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
