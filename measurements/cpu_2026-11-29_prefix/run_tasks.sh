#!/bin/sh
# The task workload of `bench serving` (no prefix cache): is concurrent serving faster than the
# offline one-at-a-time loop? The previous session's defaults (320 requests, 64 clients, max batch
# 32), two runs, niced, on the shared 2-core machine; wall and CPU-second ratios.
set -e
cd "$(dirname "$0")"
for i in 1 2; do
  OMP_NUM_THREADS=1 nice -n 10 dllm-decode bench serving --requests 320 --clients 64 --max-batch 32 \
    --json tasks$i.json > tasks$i.txt 2> tasks$i.log
  uptime >> tasks$i.txt
done
