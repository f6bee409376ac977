#!/bin/sh
# dllm-decode tune on the embedded model, all 12 tasks (16 calibration + 16 held-out test prompts
# per task, data seed 0), gen 256, block 32, budget within 1 point of one token per step. Small n:
# one prompt is 6.25 points, so the budget only separates "no prompt lost" from "some lost".
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
nice -n 10 dllm-decode tune --model embedded --tasks all --calibration 16 --held-out 16 \
    --gen-length 256 --block-length 32 --rules threshold,frechet,eb,hierarchy,dus,low_confidence \
    --no-progress --out measurements/cpu_2026-11-27/decoders/tune_embedded
