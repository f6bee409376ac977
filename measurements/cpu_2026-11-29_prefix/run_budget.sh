#!/bin/sh
# The shared-prefix workload under a budget the workload overflows: 2 MiB holds 42 float32 blocks
# of embedded-bd's K/V (49152 bytes each), fewer than the ~100 the 64 requests store, so blocks are
# evicted during the run. Two runs of three alternating off/on pairs.
set -e
cd "$(dirname "$0")"
for i in 1 2; do
  OMP_NUM_THREADS=1 nice -n 10 dllm-decode bench serving --workload shared-prefix --model embedded-bd \
    --requests 48 --chats 8 --clients 8 --max-batch 8 --prefix-tokens 256 --gen-length 32 \
    --block-length 8 --repeats 3 --prefix-cache-bytes 2097152 --json budget$i.json > budget$i.txt 2> budget$i.log
  uptime >> budget$i.txt
done
