"""Accuracy per task group and format, with intervals, from the eval runs of run_eval.sh.

    python measurements/cpu_2026-11-29_quant/summarize.py > measurements/cpu_2026-11-29_quant/accuracy.md

Per (model, threshold, format, group): mean score in % with its 95% Wilson interval, and the
paired difference from bf16 on the same prompts with its 95% half-width (normal approximation,
`eval.tune.search.paired`).
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
    """(threshold, group) -> {sample key without the config: score}."""
    out: dict[tuple[float, str], dict[str, float]] = {}
    for line in (HERE / label / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        threshold = row["decode_config"]["scheduler"]["threshold"]
        key = f"{row['task']}|{row['index']}"
        out.setdefault((threshold, GROUP_OF[row["task"]]), {})[key] = float(row["score"])
    return out


def main() -> None:
    print("| model | threshold | group | n | " + " | ".join(FORMATS) + " |")
    print("|---|---|---|---|" + "---|" * len(FORMATS))
    for model in ("embedded", "embedded-bd"):
        runs = {fmt: scores(f"{model}-{fmt}") for fmt in FORMATS
                if (HERE / f"{model}-{fmt}" / "samples.jsonl").is_file()}
        if "bf16" not in runs:
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


if __name__ == "__main__":
    main()
