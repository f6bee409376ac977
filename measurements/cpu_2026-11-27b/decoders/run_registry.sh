#!/bin/sh
# The whole scheduler registry side by side on the embedded model: each rule at its defaults on 4
# test prompts per task (data seed 0, all 12 tasks = 48 prompts, gen 256, block 32, greedy,
# stop_at_eos), then the main knob of threshold, factor, frechet, eb and one-token-per-step top-k
# swept (the tuner's grids, eval/tune/space.py) on the same prompts for the frontier and NFE at
# equal accuracy. CPU, niced, OMP_NUM_THREADS=1. Run from the repository root; resumable.
# Sized to the shared 2-core machine (load 10-12 from seven sessions): a first start at 16, then 8
# prompts per task was cut; embedded_registry/ keeps those samples (8 prompts per task for the
# first 15 rules in alphabetical order), and their first 4 prompts per task seeded embedded/.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=measurements/cpu_2026-11-27b/decoders/embedded
ALL=$(python -c "from dllm_decode.schedulers import SCHEDULERS; print(' '.join('--scheduler ' + s for s in sorted(SCHEDULERS)))")
COMMON="--model embedded --tasks all --limit 4 --gen-length 256 --block-length 32 --no-plots --no-progress --out $OUT"
nice -n 10 dllm-decode eval $COMMON $ALL
sweep() { nice -n 10 dllm-decode eval $COMMON --scheduler "$1" --sweep "$2"; }
sweep threshold threshold=1.0,0.95,0.9,0.85,0.8,0.7,0.6,0.5
sweep low_confidence tokens_per_step=2,4,8
sweep factor factor=0.5,0.75,1.0,1.3,1.6,1.9
sweep frechet margin=0.5,0.3,0.25,0.2,0.1,0.02
sweep eb gamma=0.001,0.01,0.1,0.5,1.0,2.0
nice -n 10 dllm-decode eval $COMMON --scheduler low_confidence --combine --plots > $OUT/combined.txt
python -m dllm_decode.eval.tune.compare $OUT > /dev/null
# What actually ran (for time, on the loaded machine): the command above was stopped during
# `oracle`; the remaining rules then ran as below, the three one-token-per-step rules (pc_sampler,
# random, saber: 32 forwards a prompt, nothing to learn about parallelism) on 2 prompts per task.
#   nice -n 10 dllm-decode eval $COMMON --scheduler oracle --scheduler slowfast --scheduler threshold --scheduler wino
#   nice -n 10 dllm-decode eval (COMMON with --limit 2) --scheduler pc_sampler --scheduler random --scheduler saber
# and the sweeps ran in run_sweep.sh, merged by finish.sh.
