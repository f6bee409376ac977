"""Ranges and medians per cache and arm from the JSON files: `python summary.py block4.json block8.json`."""

import json
import statistics
import sys

for path in sys.argv[1:]:
    data = json.load(open(path))
    print(f"## {path}: {data['args']}")
    print("| cache | arm | wall s (median, range) | new/old wall per round pair (range) | rounds | forwards | fed cells | most batches | answers != alone |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cache, arms in data["results"].items():
        old, new = list(arms)            # shared/join (the old behaviour), own/held (this branch)
        ratios = [n["seconds"] / o["seconds"] for o, n in zip(arms[old], arms[new])]
        for name in (old, new):
            runs = arms[name]
            s = [r["seconds"] for r in runs]
            ratio = f"{min(ratios):.2f}-{max(ratios):.2f}x (median {statistics.median(ratios):.2f})" if name == new else ""
            same = lambda k: "/".join(sorted({str(r[k]) for r in runs}))   # noqa: E731
            print(f"| {cache} | {name} | {statistics.median(s):.3f} ({min(s):.3f}-{max(s):.3f}) | {ratio} | "
                  f"{same('rounds')} | {same('forwards')} | {same('fed_cells')} | {same('most_batches')} | "
                  f"{same('differ_from_alone')} of {len(data['results'][cache][name]) and data['args']['requests']} |")
