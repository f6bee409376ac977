#!/bin/sh
# The four 2026 rules (lsp, said, dcd) and caches (dkv, dllm_cache) beside their base rules on the
# embedded model: 12 tasks x 8 test prompts (n = 96 per setting; data seed 0), gen 32, block 8
# (so hard blocks matter: DCD's window, SAID's per-block stages, the caches' block refreshes),
# greedy, stop_at_eos. Defaults first, then each rule's speed knob swept (the tuner's grids,
# eval/tune/space.py) for the frontier and NFE at equal accuracy. CPU, niced, OMP_NUM_THREADS=1.
# Run from the repository root; resumable (re-running skips finished samples).
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=measurements/cpu_2026-11-29-rules/embedded
COMMON="--model embedded --tasks all --limit 8 --gen-length 32 --block-length 8 --no-plots --no-progress --out $OUT"
run() { nice -n 10 dllm-decode eval $COMMON "$@"; }
run --scheduler threshold --scheduler low_confidence --scheduler lsp --scheduler said --scheduler dcd
run --scheduler threshold --cache prefix
run --scheduler threshold --cache dkv
run --scheduler threshold --cache dllm_cache
run --scheduler threshold --sweep threshold=1.0,0.95,0.9,0.8,0.7,0.5
run --scheduler lsp --sweep threshold=1.0,0.95,0.9,0.8,0.7,0.5
run --scheduler dcd --sweep threshold=1.0,0.95,0.9,0.8,0.7,0.5
run --scheduler said --sweep steps_per_block=0,6,4
run --scheduler low_confidence --sweep tokens_per_step=2,4
nice -n 10 dllm-decode eval $COMMON --scheduler low_confidence --combine > $OUT/combined.txt
python -m dllm_decode.eval.tune.compare $OUT > /dev/null
