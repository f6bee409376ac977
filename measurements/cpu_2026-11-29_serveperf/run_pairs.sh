#!/bin/bash
# Interleaved `bench serving` runs, side by side: the baseline (main @ feb0ea6, uvicorn on h11 and
# asyncio), this branch, and this branch with a 0.5 ms GIL switch interval.
#   git archive feb0ea6 | tar -x -C /tmp/sp/base          # the baseline's package
#   /tmp/sp/block/{httptools,uvloop}.py: `raise ImportError` # the baseline runs without them
#   bash run_pairs.sh TAG N [swi]                          # N rounds; outputs /tmp/sp/TAG.{base,new,swi}.i.out
. "$(git rev-parse --show-toplevel)/.venv/bin/activate"
export OMP_NUM_THREADS=1
cd /tmp
A="--requests 320 --clients 64 --max-batch 32"
for i in $(seq 1 "$2"); do
  PYTHONPATH=/tmp/sp/block:/tmp/sp/base python -m dllm_decode bench serving $A > /tmp/sp/$1.base.$i.out 2>&1
  python -m dllm_decode bench serving $A > /tmp/sp/$1.new.$i.out 2>&1
  if [ "$3" = swi ]; then
    python -c "import sys; sys.setswitchinterval(0.0005); sys.argv=['dllm-decode','bench','serving',*'$A'.split()]; from dllm_decode.cli import main; main()" > /tmp/sp/$1.swi.$i.out 2>&1
  fi
done
