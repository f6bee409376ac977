#!/bin/sh
# SparseD (--attention sparsed) beside dense attention on the embedded model.
# 1. accuracy/: 12 tasks x 8 test prompts (n = 96 per setting; data seed 0), gen 32, block 8,
#    threshold 0.9, no cache, greedy, stop_at_eos (the shape of ../cpu_2026-11-29-rules/run.sh);
#    and low_confidence (one token per forward), where the pattern is reused for most forwards.
#    Settings: dense; the paper's defaults (tile 128 > the canvas: one tile, so it must equal
#    dense); the README's short-context example (select 0.5, tile 32); and settings whose
#    patterns engage on these short canvases (tile 8 and 4, skip 0.2 and 0).
# 2. timing.py: attention time and forward time, dense vs sparse, at long synthetic prompts.
# CPU, niced, OMP_NUM_THREADS=1. Run from the repository root; resumable.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
D=measurements/cpu_2026-11-29-sparsed
OUT=$D/accuracy
COMMON="--model embedded --tasks all --limit 8 --gen-length 32 --block-length 8 --no-plots --no-progress --out $OUT"
run() { nice -n 10 dllm-decode eval $COMMON "$@" > /dev/null; }
for RULE in threshold low_confidence; do
  run --scheduler $RULE
  run --scheduler $RULE --attention sparsed
  run --scheduler $RULE --attention sparsed:select=0.5,tile=32
  run --scheduler $RULE --attention sparsed:tile=8
  run --scheduler $RULE --attention sparsed:tile=8,skip=0
  run --scheduler $RULE --attention sparsed:tile=4,skip=0
  run --scheduler $RULE --attention sparsed:tile=4,skip=0,scale=n_heads
done
python $D/table.py $OUT > $D/accuracy.md
nice -n 10 python $D/timing.py > $D/timing.md
