#!/bin/sh
# dllm-decode tune on the analytic ideal model over the coupled and uncoupled list tasks (32
# calibration + 32 held-out test prompts per task, data seed 0, answer-length canvases), budget
# within 10 points of one token per step on a one-sided 80% Wilson bound, with the exhaustive sweep
# over the same grid (forward ratio, best single global setting). Run from the repository root.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
nice -n 10 dllm-decode tune --model ideal:noise=0.01 \
    --tasks copy,replace_index,shuffle,replace_random,insert_random,remove_random,latin_square \
    --calibration 32 --held-out 32 --gen-length answer --budget within:10 --confidence 0.8 \
    --rules threshold,factor,frechet,eb,entropy_threshold,hierarchy,slowfast,low_confidence \
    --exhaustive --no-progress --out measurements/cpu_2026-11-27b/decoders/tune_ideal
