#!/bin/sh
# Follow-up settings on the embedded model (same prompts and shape as run.sh's embedded/, n = 96):
# DCD without its end-of-text truncation and with a window as wide as the block, SAID's threshold
# form, LSP's persistence test, dKV-Cache with a longer delay and dLLM-Cache's response refreshed
# every 2 steps. Run after run.sh, from the repository root; resumable.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=measurements/cpu_2026-11-29-rules/embedded
COMMON="--model embedded --tasks all --limit 8 --gen-length 32 --block-length 8 --no-plots --no-progress --out $OUT"
run() { nice -n 10 dllm-decode eval $COMMON "$@"; }
run --scheduler dcd:eos_pad=false --scheduler dcd:window=8 --scheduler said:mode=threshold --scheduler lsp:stability=persistent
run --scheduler threshold --cache dkv -c delay=3
run --scheduler threshold --cache dllm_cache -c gen_every=2
nice -n 10 dllm-decode eval $COMMON --scheduler low_confidence --combine --plots > $OUT/combined.txt
python -m dllm_decode.eval.tune.compare $OUT > /dev/null
