#!/bin/sh
# Accuracy with DiffusionGemma's encoder cache in low precision (--kv-cache-dtype fp8 / int8
# against auto = bf16) on the shipped `embedded-noise` model, bfloat16, uniform-noise default
# decode with 16 steps, seed 0. n = 100: 10 test prompts per waiting-line task (10 tasks). Run
# from the repository root; `summarize.py kv-noise` compares the runs sample by sample.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
HERE=measurements/cpu_2026-11-29_quant
for kv in auto fp8 int8; do
  nice -n 10 dllm-decode eval --model embedded-noise --dtype bfloat16 --tasks waiting_line --limit 10 \
    --kv-cache-dtype $kv --scheduler uniform_noise:steps=16 \
    --no-plots --no-progress --out $HERE/eval/kv-embedded-noise-$kv-waiting_line
done
