#!/bin/sh
# embedded-bd's puzzles group at n = 100 per threshold (50 test prompts per task, latin_square and
# sudoku), the group run_eval.sh measured at n = 20: bf16, int8, fp8 and int4:64 calibrated both
# ways, at threshold 0.9 and 0.5, bfloat16 activations. The first 10 prompts per task repeat
# run_eval.sh's (same seeds, same decode), so summarize.py merges the two runs by prompt.
# Run from the repository root; checkpoints go to $CKPT (not committed).
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
HERE=measurements/cpu_2026-11-29_quant
CKPT=${CKPT:-/tmp/quant_ckpt}
model=embedded-bd
[ -d $CKPT/$model-int8 ] || nice -n 10 dllm-decode quantize --model $model --out $CKPT/$model-int8 --format int8
[ -d $CKPT/$model-fp8 ] || nice -n 10 dllm-decode quantize --model $model --out $CKPT/$model-fp8 --format fp8
[ -d $CKPT/$model-int4-decode ] || nice -n 10 dllm-decode quantize --model $model --out $CKPT/$model-int4-decode \
  --format int4:64 --calibration 128 --calibration-source decode
[ -d $CKPT/$model-int4-clean ] || nice -n 10 dllm-decode quantize --model $model --out $CKPT/$model-int4-clean \
  --format int4:64 --calibration 128 --calibration-source clean
run() {  # model-dir label
  nice -n 10 dllm-decode eval --model "$1" --dtype bfloat16 --tasks puzzles --limit 50 \
    --scheduler threshold --sweep threshold=0.9,0.5 --no-plots --no-progress --out $HERE/eval/$2-puzzles
}
run $model $model-bf16
for fmt in int8 fp8 int4-decode int4-clean; do
  run $CKPT/$model-$fmt $model-$fmt
done
