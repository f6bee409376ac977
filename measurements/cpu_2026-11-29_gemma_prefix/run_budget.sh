#!/bin/sh
# As run.sh, under a 512 KiB budget that the workload overflows (its store holds 1.28 MB
# unbounded), one run of three alternating off/on pairs. Outputs: budget.json, budget.txt.
set -e
cd "$(dirname "$0")"
OMP_NUM_THREADS=1 nice -n 10 dllm-decode bench serving --workload shared-prefix --model embedded-noise \
  --requests 48 --chats 8 --clients 8 --max-batch 8 --prefix-tokens 256 --gen-length 32 \
  --prefix-cache-bytes 524288 --repeats 3 --json budget.json > budget.txt 2> budget.log
uptime >> budget.txt
