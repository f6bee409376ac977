#!/bin/sh
# dllm-decode tune on the analytic ideal model over the coupled and uncoupled list tasks
# (24 calibration + 24 held-out test prompts per task, data seed 0, answer-length canvases),
# with the exhaustive sweep over the same grid for the forward ratio and the best global setting.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
nice -n 10 dllm-decode tune --model ideal:noise=0.01 \
    --tasks copy,replace_index,shuffle,replace_random,insert_random,remove_random,latin_square \
    --calibration 24 --held-out 24 --gen-length answer \
    --rules threshold,factor,frechet,eb,entropy_threshold,hierarchy,slowfast,low_confidence \
    --exhaustive --no-progress --out measurements/cpu_2026-11-27/decoders/tune_ideal
