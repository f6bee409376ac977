"""Benchmarks behind `dllm-decode bench`: every comparison measured side by side, as ratios."""
