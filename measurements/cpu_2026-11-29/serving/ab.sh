#!/bin/sh
# Run from the repository root with its venv active. Alternates the socket binding of
# `dllm_decode.serve.app.background` (before: no IPPROTO_TCP; after: as committed) twice.
OUT=measurements/cpu_2026-11-29/serving
for round in 1 2; do
  sed -i 's/socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)/socket.socket(socket.AF_INET, socket.SOCK_STREAM)/' dllm_decode/serve/app.py
  OMP_NUM_THREADS=1 python -m dllm_decode bench serving --requests 64 --clients 16 --max-batch 16 \
      --json $OUT/nodelay_before_$round.json > $OUT/nodelay_before_$round.txt 2>&1
  git checkout dllm_decode/serve/app.py
  OMP_NUM_THREADS=1 python -m dllm_decode bench serving --requests 64 --clients 16 --max-batch 16 \
      --json $OUT/nodelay_after_$round.json > $OUT/nodelay_after_$round.txt 2>&1
done
