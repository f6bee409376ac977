#!/bin/sh
# int4 accuracy again after int4's zero became GPTQ's integer zero point (one byte per group):
# round to nearest and GPTQ calibrated both ways (128 train-split prompts), group 64, on both
# embedded models, bfloat16 activations, threshold 0.9 and 0.5; n = 100 per group and
# threshold (10 prompts per waiting-line task, 50 per puzzle task), in two folders per run.
# Checkpoints go to $CKPT (not committed). Run from the repository root.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
HERE=measurements/cpu_2026-11-29_quant
CKPT=${CKPT:-/tmp/quant_ckpt_zp}
for model in embedded embedded-bd; do
  [ -d $CKPT/$model-int4-rtn ] || nice -n 10 dllm-decode quantize --model $model --out $CKPT/$model-int4-rtn --format int4:64
  for source in decode clean; do
    [ -d $CKPT/$model-int4-$source ] || nice -n 10 dllm-decode quantize --model $model \
      --out $CKPT/$model-int4-$source --format int4:64 --calibration 128 --calibration-source $source
  done
  for fmt in int4-rtn int4-decode int4-clean; do
    for part in waiting_line:10 puzzles:50; do
      tasks=${part%%:*}; limit=${part#*:}
      nice -n 10 dllm-decode eval --model $CKPT/$model-$fmt --dtype bfloat16 --tasks $tasks \
        --limit $limit --scheduler threshold --sweep threshold=0.9,0.5 --no-plots --no-progress \
        --out $HERE/eval/$model-$fmt-$tasks
    done
  done
done
