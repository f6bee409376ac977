#!/bin/sh
# The 2026 rules (lsp, leap, said, dcd) and caches (dkv, dllm_cache) beside their base rules.
# 1. embedded/: the embedded model, 12 tasks x 8 test prompts (n = 96 per setting; data seed 0),
#    gen 32, block 8 (so hard blocks matter: DCD's window, SAID's per-block stages, the caches'
#    block refreshes), greedy, stop_at_eos. Defaults first, then each rule's speed knob swept
#    (the tuner's grids, eval/tune/space.py) for the frontier and NFE at equal accuracy.
# 2. embedded_256/: the same prompts at the previous registry run's shape (gen 256, block 32).
# 3. ideal/: the analytic ideal model (noise 0.01) on the coupled tasks and two C = 0 contrasts,
#    24 prompts per task (n = 144), answer-length canvas, rules only (it has no K/V to cache).
# CPU, niced, OMP_NUM_THREADS=1. Run from the repository root; resumable (re-running skips
# finished samples).
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
D=measurements/cpu_2026-11-29-rules
OUT=$D/embedded
COMMON="--model embedded --tasks all --limit 8 --gen-length 32 --block-length 8 --no-plots --no-progress --out $OUT"
run() { nice -n 10 dllm-decode eval $COMMON "$@"; }
RULES="--scheduler threshold --scheduler low_confidence --scheduler lsp --scheduler leap --scheduler said --scheduler dcd"
run $RULES
run --scheduler threshold --cache prefix
run --scheduler threshold --cache dkv
run --scheduler threshold --cache dllm_cache
run --scheduler threshold --cache dllm_cache -c refresh_at_block=true
run --scheduler threshold --sweep threshold=1.0,0.95,0.9,0.8,0.7,0.5
run --scheduler lsp --sweep threshold=1.0,0.95,0.9,0.8,0.7,0.5
run --scheduler dcd --sweep threshold=1.0,0.95,0.9,0.8,0.7,0.5
run --scheduler leap --sweep low=0.9,0.7,0.5,0.3
run --scheduler said --sweep steps_per_block=0,6,4
run --scheduler low_confidence --sweep tokens_per_step=2,4
nice -n 10 dllm-decode eval $COMMON --scheduler low_confidence --combine --plots > $OUT/combined.txt
python -m dllm_decode.eval.tune.compare $OUT > /dev/null

OUT=$D/embedded_256
COMMON="--model embedded --tasks all --limit 8 --gen-length 256 --block-length 32 --no-plots --no-progress --out $OUT"
run $RULES
run --scheduler threshold --cache prefix
run --scheduler threshold --cache dkv
run --scheduler threshold --cache dllm_cache
nice -n 10 dllm-decode eval $COMMON --scheduler low_confidence --combine > $OUT/combined.txt
python -m dllm_decode.eval.tune.compare $OUT > /dev/null

OUT=$D/ideal
COMMON="--model ideal:noise=0.01 --tasks copy,replace_index,shuffle,replace_random,insert_random,latin_square --limit 24 --gen-length answer --no-plots --no-progress --out $OUT"
run $RULES
run --scheduler threshold --sweep threshold=1.0,0.95,0.9,0.85,0.8,0.7,0.6,0.5
run --scheduler lsp --sweep threshold=1.0,0.95,0.9,0.85,0.8,0.7,0.6,0.5
run --scheduler dcd --sweep threshold=1.0,0.95,0.9,0.85,0.8,0.7,0.6,0.5
run --scheduler leap --sweep low=0.9,0.7,0.5,0.3
nice -n 10 dllm-decode eval $COMMON --scheduler low_confidence --combine > $OUT/combined.txt
python -m dllm_decode.eval.tune.compare $OUT > /dev/null
