#!/bin/sh
# ES-dLLM (cache `es`) beside no cache and the dual cache, on the shipped masked `embedded` model,
# with the settings of measurements/cpu_2026-11-29-rules/run.sh:
# 1. embedded/: 12 tasks x 8 test prompts (n = 96 per setting; data seed 0), gen 32, block 8,
#    greedy, stop_at_eos, threshold 0.9: none, dual, es (reference defaults, stale suffix) and
#    es:suffix=refresh.
# 2. embedded_256/: the same prompts at gen 256, block 32.
# 3. bench/: wall clock at gen 256, batch 8, 24 prompts, 3 interleaved repeats: none, prefix,
#    dual (always in the bench), dllm_cache, es.
# CPU, niced, OMP_NUM_THREADS=1. Run from the repository root; the evals resume. Then
# `python measurements/cpu_2026-11-29-es/table.py > measurements/cpu_2026-11-29-es/tables.md`.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
D=measurements/cpu_2026-11-29-es
for shape in "embedded 32 8" "embedded_256 256 32"; do
    set -- $shape
    OUT=$D/$1
    COMMON="--model embedded --tasks all --limit 8 --gen-length $2 --block-length $3 --no-plots --no-progress --out $OUT"
    nice -n 10 dllm-decode eval $COMMON --scheduler threshold
    nice -n 10 dllm-decode eval $COMMON --scheduler threshold --cache dual
    nice -n 10 dllm-decode eval $COMMON --scheduler threshold --cache es
    nice -n 10 dllm-decode eval $COMMON --scheduler threshold --cache es -c suffix=refresh
done
mkdir -p $D/bench
nice -n 10 dllm-decode bench cache --per-task 2 --gen-length 256 --batch 8 --repeats 3 --no-stop-at-eos \
    --no-new-caches --variant dllm_cache --variant es --json $D/bench/cache_long.json > $D/bench/cache_long.txt
