#!/bin/sh
# The three rules that landed after run_registry.sh (remdm, info_gain, apd), at their defaults on
# the same 48 prompts (4 per task x 12 tasks, data seed 0, gen 256, block 32, greedy,
# stop_at_eos), into the same folder, then the side-by-side tables remade. CPU, niced,
# OMP_NUM_THREADS=1; run from the repository root after run_registry.sh (resumable).
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=measurements/cpu_2026-11-27b/decoders/embedded
COMMON="--model embedded --tasks all --limit 4 --gen-length 256 --block-length 32 --no-plots --no-progress --out $OUT"
nice -n 10 dllm-decode eval $COMMON --scheduler remdm --scheduler apd --scheduler info_gain
nice -n 10 dllm-decode eval $COMMON --scheduler low_confidence --combine --plots > $OUT/combined.txt
python -m dllm_decode.eval.tune.compare $OUT > /dev/null
