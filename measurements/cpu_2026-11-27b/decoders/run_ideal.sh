#!/bin/sh
# The whole scheduler registry side by side on the analytic ideal model (ideal:noise=0.01), the
# coupled tasks (shuffle, insert/replace random, Latin square) and two C = 0 contrasts (copy,
# replace_index), 24 test prompts per task (data seed 0), answer-length canvases (one block),
# greedy; each rule at its defaults, then the main knobs of the confidence rules swept for the
# frontier. Run from the repository root; resumable.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=measurements/cpu_2026-11-27b/decoders/ideal_registry
ALL=$(python -c "from dllm_decode.schedulers import SCHEDULERS; print(' '.join('--scheduler ' + s for s in sorted(SCHEDULERS)))")
COMMON="--model ideal:noise=0.01 --tasks copy,replace_index,shuffle,replace_random,insert_random,latin_square --limit 24 --gen-length answer --no-progress"
nice -n 10 dllm-decode eval $COMMON $ALL --out $OUT --no-plots
sweep() { nice -n 10 dllm-decode eval $COMMON --scheduler "$1" --sweep "$2" --out $OUT --no-plots; }
sweep threshold threshold=1.0,0.95,0.9,0.85,0.8,0.7,0.6,0.5
sweep factor factor=0.5,0.75,1.0,1.3,1.6,1.9
sweep frechet margin=0.5,0.3,0.25,0.2,0.1,0.02
sweep eb gamma=0.001,0.01,0.1,0.5,1.0,2.0
sweep low_confidence tokens_per_step=2,4,8
nice -n 10 dllm-decode eval $COMMON --scheduler low_confidence --out $OUT --combine --plots > $OUT/combined.txt
