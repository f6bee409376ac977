#!/bin/sh
# Side by side of the new decoding rules at their defaults, with the one-token-per-step reference
# and Fast-dLLM's threshold 0.9, on the embedded model (24 test prompts per task, data seed 0, all
# 12 tasks, gen 256, block 32, greedy, stop_at_eos) and on the analytic ideal model (answer-length
# canvases, one block). CPU, niced, OMP_NUM_THREADS=1.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=measurements/cpu_2026-11-27/decoders
RULES="--scheduler low_confidence --scheduler threshold --scheduler dus --scheduler slowfast --scheduler hierarchy --scheduler multi_block --scheduler frechet"
# pc_sampler and less (quality rules at about one token per step, as slow as the reference on this
# shared CPU) ran on 8 prompts per task only, in a separate directory:
QUALITY="--scheduler low_confidence --scheduler pc_sampler --scheduler less"
nice -n 10 dllm-decode eval --model embedded --tasks all --limit 24 --gen-length 256 --block-length 32 \
    $RULES --out $OUT/embedded --no-plots --no-progress
nice -n 10 dllm-decode eval --model embedded --tasks all --limit 8 --gen-length 256 --block-length 32 \
    $QUALITY --out $OUT/embedded_quality --no-plots --no-progress
nice -n 10 dllm-decode eval --model ideal:noise=0.01 \
    --tasks copy,replace_index,shuffle,replace_random,insert_random,remove_random,latin_square \
    --limit 24 --gen-length answer $RULES --scheduler pc_sampler --scheduler less --out $OUT/ideal --no-plots --no-progress
