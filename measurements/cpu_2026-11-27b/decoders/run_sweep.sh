#!/bin/sh
# The sweeps of run_registry.sh, run beside its defaults in a second process (for time) into
# embedded_sweep/ on the same 48 prompts; finish.sh merges both folders into embedded/.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
COMMON="--model embedded --tasks all --limit 4 --gen-length 256 --block-length 32 --no-plots --no-progress --out measurements/cpu_2026-11-27b/decoders/embedded_sweep"
sweep() { nice -n 10 dllm-decode eval $COMMON --scheduler "$1" --sweep "$2"; }
sweep threshold threshold=1.0,0.95,0.9,0.85,0.8,0.7,0.6,0.5
sweep low_confidence tokens_per_step=2,4,8
sweep factor factor=0.5,0.75,1.0,1.3,1.6,1.9
sweep frechet margin=0.5,0.3,0.25,0.2,0.1,0.02
sweep eb gamma=0.001,0.01,0.1,0.5,1.0,2.0
