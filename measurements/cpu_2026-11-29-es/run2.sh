#!/bin/sh
# After run.sh: ES-dLLM with no skip layer and the suffix recomputed at every block start, which
# is the dual cache (tested on tiny models in tests/caches/test_early_skip.py), on the same 96
# prompts at gen 32, block 8: its row must equal `threshold cache dual`'s.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=measurements/cpu_2026-11-29-es/embedded
nice -n 10 dllm-decode eval --model embedded --tasks all --limit 8 --gen-length 32 --block-length 8 --no-plots \
    --no-progress --out $OUT --scheduler threshold --cache es -c proportions=1@0 -c suffix=refresh
# Two more bench runs (each its own 3 interleaved repeats) for a range of the wall-clock ratios.
for i in 2 3; do
    nice -n 10 dllm-decode bench cache --per-task 2 --gen-length 256 --batch 8 --repeats 3 --no-stop-at-eos \
        --no-new-caches --variant dllm_cache --variant es \
        --json measurements/cpu_2026-11-29-es/bench/cache_long_$i.json > measurements/cpu_2026-11-29-es/bench/cache_long_$i.txt
done
