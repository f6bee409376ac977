"""`run_eval_kv_noise.sh`'s runs (DiffusionGemma `embedded-noise`, encoder cache auto / fp8 /
int8) side by side: accuracy with its 95% Wilson interval, the paired difference against auto,
and how many outputs are identical to auto's. Writes noise_kv.json (committed; samples.jsonl is
not) and prints the table. Run from the repository root."""

from __future__ import annotations

import json
from pathlib import Path

from dllm_decode.eval.tune.search import paired, wilson

HERE = Path(__file__).parent
RUNS = {name: HERE / "eval" / f"kv-embedded-noise-{name}-waiting_line" for name in ("auto", "fp8", "int8")}


def rows(folder: Path) -> dict[str, tuple[float, str]]:
    """{task|index: (score, output)} of one run."""
    out = {}
    for line in (folder / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[f"{row['task']}|{row['index']}"] = (float(row["score"]), row["output"])
    return out


def main() -> None:
    runs = {name: rows(folder) for name, folder in RUNS.items()}
    base = runs["auto"]
    result = {}
    print("| kv_cache_dtype | n | accuracy % [95% CI] | vs auto (paired) | outputs identical to auto |")
    print("|---|---|---|---|---|")
    for name, got in runs.items():
        keys = sorted(got)
        k, n = sum(got[key][0] for key in keys), len(keys)
        drop, half = paired([got[key][0] for key in keys], [base[key][0] for key in keys])
        same = sum(got[key][1] == base[key][1] for key in keys)
        result[name] = {"n": n, "accuracy": k / n, "wilson95": [wilson(k, n, -1.96), wilson(k, n, 1.96)],
                        "paired_drop": drop, "paired_half_width": half, "identical_outputs": same}
        print(f"| {name} | {n} | {100 * k / n:.1f} [{100 * wilson(k, n, -1.96):.1f}, "
              f"{100 * wilson(k, n, 1.96):.1f}] | {-drop + 0.0:+.1f} ± {half:.1f} | {same}/{n} |")
    (HERE / "noise_kv.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
