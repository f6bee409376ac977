"""`dllm-decode tune`: the fastest decoding policy per task within a quality budget.

`space` lists each rule's main speed knob and its grid (conservative to aggressive), `search`
draws the calibration and held-out splits, runs the reference and a budgeted search through the
eval harness (resumable JSONL, batched, data-parallel like `eval`), and chooses per task and
overall; `output` writes `presets.json` (loadable by name, `eval/harness/presets.py`), `tune.json`
and `report.md`.
"""
