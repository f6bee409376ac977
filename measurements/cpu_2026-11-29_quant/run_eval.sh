#!/bin/sh
# Accuracy of the two embedded models per weight format (CPU, bfloat16 activations), at the
# default scheduler (threshold 0.9) and a fast threshold (0.5): `embedded` on 50 test prompts
# per task (n = 500 for waiting_line, 100 for puzzles), `embedded-bd` on 10 (n = 100 and 20:
# the shared machine ran at load 25-28 and 50 did not fit the session). Run from the repository
# root. The quantized
# checkpoints are written to $CKPT (not committed; this script remakes them), int4 calibrated on
# 128 train-split prompts (GPTQ) from real decodes or from clean prompt + answer text.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
HERE=measurements/cpu_2026-11-29_quant
CKPT=${CKPT:-/tmp/quant_ckpt}
for model in embedded embedded-bd; do
  nice -n 10 dllm-decode quantize --model $model --out $CKPT/$model-int8 --format int8
  nice -n 10 dllm-decode quantize --model $model --out $CKPT/$model-fp8 --format fp8
  nice -n 10 dllm-decode quantize --model $model --out $CKPT/$model-int4-rtn --format int4:64
  nice -n 10 dllm-decode quantize --model $model --out $CKPT/$model-int4-decode --format int4:64 \
    --calibration 128 --calibration-source decode
  nice -n 10 dllm-decode quantize --model $model --out $CKPT/$model-int4-clean --format int4:64 \
    --calibration 128 --calibration-source clean
done
run() {  # model-dir label limit
  nice -n 10 dllm-decode eval --model "$1" --dtype bfloat16 --tasks all --limit "$3" \
    --scheduler threshold --sweep threshold=0.9,0.5 --no-plots --no-progress --out $HERE/eval/$2
}
run embedded embedded-bf16 50
for fmt in int8 fp8 int4-rtn int4-decode int4-clean; do
  run $CKPT/embedded-$fmt embedded-$fmt 50
done
run embedded-bd embedded-bd-bf16 10
for fmt in int4-decode int4-clean int8 fp8 int4-rtn; do
  run $CKPT/embedded-bd-$fmt embedded-bd-$fmt 10
done
