#!/bin/sh
# The whole scheduler registry side by side on the embedded model, each rule at its defaults
# (8 test prompts per task, data seed 0, all 12 tasks = 96 prompts, gen 256, block 32, greedy,
# stop_at_eos), then each rule's main knob swept over the tuner's grid (eval/tune/space.py) on
# 4 prompts per task (48) for the frontier and NFE at equal accuracy, with the one-token-per-step
# reference on the same prompts. (Sized to the shared 2-core machine: a first start at 16 prompts
# per task was cut after 7 rules; its samples are a superset of these and are reused.) CPU, niced, OMP_NUM_THREADS=1. Run from the repository root;
# resumable (re-run the same script).
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=measurements/cpu_2026-11-27b/decoders
ALL=$(python -c "from dllm_decode.schedulers import SCHEDULERS; print(' '.join('--scheduler ' + s for s in sorted(SCHEDULERS)))")
COMMON="--model embedded --tasks all --gen-length 256 --block-length 32 --no-plots --no-progress"
nice -n 10 dllm-decode eval $COMMON --limit 8 $ALL --out $OUT/embedded_registry
S="$OUT/embedded_sweep"
sweep() { nice -n 10 dllm-decode eval $COMMON --limit 4 --scheduler "$1" --sweep "$2" --out $S; }
nice -n 10 dllm-decode eval $COMMON --limit 4 --scheduler low_confidence --out $S
sweep threshold threshold=1.0,0.95,0.9,0.85,0.8,0.7,0.6,0.5
sweep factor factor=0.5,0.75,1.0,1.3,1.6,1.9
sweep frechet margin=0.5,0.3,0.25,0.2,0.1,0.02
sweep eb gamma=0.001,0.01,0.1,0.5,1.0,2.0
sweep entropy_threshold threshold=0.1,0.2,0.3,0.4,0.5,0.7,1.0
sweep hierarchy low_threshold=0.9,0.75,0.62,0.5,0.4,0.3
sweep slowfast high_threshold=1.0,0.9,0.8,0.7,0.6,0.5
sweep klass confidence_threshold=0.95,0.9,0.8,0.7
sweep less confidence=0.95,0.9,0.8,0.7
sweep local_leap tau=0.9,0.85,0.8,0.75,0.7,0.6
sweep low_confidence tokens_per_step=2,4,8
sweep dus block_length=4,8,16,32
sweep multi_block threshold=0.1,0.3,0.5,0.7,1.0
nice -n 10 dllm-decode eval $COMMON --limit 4 --scheduler low_confidence --out $S --combine --plots > $S/combined.txt
