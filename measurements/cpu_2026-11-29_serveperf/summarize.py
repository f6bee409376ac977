"""Medians and ranges of the `bench serving` ratios in runs/bench_*.txt, per side and group of rounds.

    python summarize.py            # writes summary.json and summary.txt beside this file
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).parent
PATTERNS = {
    "concurrency1_over_offline_wall": r"concurrency 1 / offline: ([0-9.]+)x",
    "concurrency1_over_offline_cpu": r"server at concurrency 1 / offline ([0-9.]+)x",
    "concurrent_over_offline_wall": r"throughput concurrent / offline one at a time: ([0-9.]+)x",
    "concurrent_over_offline_cpu": r"concurrent / offline one at a time ([0-9.]+)x",
    "offline_ms_per_request": r"offline one at a time: ([0-9.]+) s",
}
GROUPS = {"all (f1-f4)": ("f1", "f2", "f3", "f4"), "under load (f1, f2)": ("f1", "f2"),
          "quieter (f3, f4)": ("f3", "f4")}


def read(path: Path) -> dict[str, float]:
    text = path.read_text()
    out = {key: float(re.search(pattern, text).group(1)) for key, pattern in PATTERNS.items()}
    out["offline_ms_per_request"] = round(out["offline_ms_per_request"] * 1000 / 320, 3)
    return out


def main() -> None:
    summary: dict[str, dict] = {}
    for group, tags in GROUPS.items():
        for side in ("base", "new", "swi"):
            runs = [read(p) for tag in tags for p in sorted(HERE.glob(f"runs/bench_{tag}.{side}.*.txt"))]
            if runs:
                summary.setdefault(group, {})[side] = {
                    "runs": len(runs),
                    **{key: {"median": round(statistics.median(r[key] for r in runs), 3),
                             "min": min(r[key] for r in runs), "max": max(r[key] for r in runs)} for key in PATTERNS}}
    lines = []
    for group, sides in summary.items():
        lines.append(f"{group}")
        for side, figures in sides.items():
            cells = "  ".join(f"{key} {v['median']} ({v['min']}-{v['max']})" for key, v in figures.items() if key != "runs")
            lines.append(f"  {side:<4} n={figures['runs']:<3} {cells}")
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (HERE / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
