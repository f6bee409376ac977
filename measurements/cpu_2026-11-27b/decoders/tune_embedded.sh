#!/bin/sh
# dllm-decode tune on the embedded model, 6 of the 12 tasks (three C = 0, three coupled), 8 calibration + 8 held-out test prompts per
# task (data seed 0), gen 256, block 32; budget within 10 points of one token per step, accepted on
# a one-sided 80% Wilson bound (the least drop certifiable on 8 prompts is 8.1 points, so only a
# point that loses no calibration prompt is accepted); with the exhaustive sweep over the same grid.
# Sized to the shared 2-core machine. Run from the repository root; resumable.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
nice -n 10 dllm-decode tune --model embedded --tasks copy,reverse,sort,shuffle,replace_random,latin_square --calibration 8 --held-out 8 \
    --gen-length 256 --block-length 32 --rules threshold,factor,frechet,eb \
    --budget within:10 --confidence 0.8 --exhaustive --no-progress \
    --out measurements/cpu_2026-11-27b/decoders/tune_embedded
