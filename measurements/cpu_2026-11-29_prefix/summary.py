"""Ranges over every off/on pair of the shared-prefix runs in this folder (run*.json: 64 MiB
budget; budget*.json: 2 MiB) and the task workload's ratios (tasks*.json).

    python measurements/cpu_2026-11-29_prefix/summary.py
"""

import json
import pathlib

HERE = pathlib.Path(__file__).parent


def span(values):
    return f"{min(values):.3g}-{max(values):.3g}"


for group in ("run", "budget"):
    reports = [json.loads(p.read_text()) for p in sorted(HERE.glob(f"{group}[0-9].json"))]
    if not reports:
        continue
    phases = [p for r in reports for p in r["phases"]]
    on = [p for p in phases if p["prefix_cache"] == "on"]
    off = [p for p in phases if p["prefix_cache"] == "off"]
    print(f"{group}*.json: {len(reports)} runs, {len(on)} off/on pairs, budget {reports[0]['prefix_cache_bytes']} bytes")
    print(f"  requests/s on/off per pair: {span([x for r in reports for x in r['speedup']])}x")
    print(f"  requests per server CPU second on/off per pair: {span([x for r in reports for x in r['cpu_speedup']])}x")
    print(f"  ttft p50 off {span([p['ttft_p50'] for p in off])} s, on {span([p['ttft_p50'] for p in on])} s")
    print(f"  store bytes (max) {max(p['store']['resident_bytes'] for p in on)}, evicted per phase "
          f"{span([p['store']['evicted'] for p in on])}, answers differing from offline "
          f"{sum(p['different_from_offline'] for p in phases)} of {sum(p['answered'] for p in phases)}")
for path in sorted(HERE.glob("tasks[0-9].json")):
    r = json.loads(path.read_text())
    print(f"{path.name}: concurrent / offline one at a time {r['concurrent_over_offline']}x (wall), "
          f"{r['concurrent_over_offline_cpu']}x (CPU); server at concurrency 1 / offline "
          f"{r['server_over_offline']}x (wall), {r['server_over_offline_cpu']}x (CPU)")
