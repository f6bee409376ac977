#!/bin/sh
# Accuracy with a low-precision KV cache (--kv-cache-dtype fp8 / int8 against auto = bf16), on
# both embedded models, bfloat16 weights and activations, threshold 0.9 (default) and 0.5, with
# the cache that keeps K/V for each: dual (Fast-dLLM) on `embedded`, block on `embedded-bd`.
# n = 100 per group and threshold: 10 test prompts per waiting-line task (10 tasks), 50 per
# puzzle task (2 tasks), in two folders per run. Run from the repository root; `summarize.py kv`
# tabulates it.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
HERE=measurements/cpu_2026-11-29_quant
for pair in embedded:dual embedded-bd:block; do
  model=${pair%%:*}; cache=${pair#*:}
  for kv in auto fp8 int8; do
    for part in waiting_line:10 puzzles:50; do
      tasks=${part%%:*}; limit=${part#*:}
      nice -n 10 dllm-decode eval --model $model --dtype bfloat16 --tasks $tasks --limit $limit \
        --cache $cache --kv-cache-dtype $kv --scheduler threshold --sweep threshold=0.9,0.5 \
        --no-plots --no-progress --out $HERE/eval/kv-$model-$cache-$kv-$tasks
    done
  done
done
