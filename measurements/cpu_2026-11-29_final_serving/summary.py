"""Medians and ranges of the ratios in runs/tasks*.json (`run.sh`).

    python summary.py
"""

import json
import statistics
from pathlib import Path

KEYS = ("server_over_offline", "server_over_offline_cpu", "concurrent_over_offline", "concurrent_over_offline_cpu")
runs = [json.loads(p.read_text()) for p in sorted(Path(__file__).parent.glob("runs/tasks*.json"))]
print(f"{len(runs)} runs; answers lost / failed / different from offline: "
      f"{sum(r[p]['lost'] for r in runs for p in ('sequential', 'concurrent'))} / "
      f"{sum(r[p]['failed'] for r in runs for p in ('sequential', 'concurrent'))} / "
      f"{sum(r[p]['different_from_offline'] for r in runs for p in ('sequential', 'concurrent'))}")
for key in KEYS:
    values = [r[key] for r in runs]
    print(f"{key}: median {statistics.median(values):.3f}, range {min(values):.3f}-{max(values):.3f}")
