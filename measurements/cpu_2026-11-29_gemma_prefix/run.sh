#!/bin/sh
# The shared-prefix serving workload on the shipped DiffusionGemma (`embedded-noise`, its shipped
# decoding; the prefix cache reuses its causal encoder's prompt K/V), three runs (each three
# alternating off/on pairs), niced on the shared 2-core CPU machine.
# Outputs: run{1,2,3}.json (report) and run{1,2,3}.txt (printed table, then `uptime`).
set -e
cd "$(dirname "$0")"
for i in 1 2 3; do
  OMP_NUM_THREADS=1 nice -n 10 dllm-decode bench serving --workload shared-prefix --model embedded-noise \
    --requests 48 --chats 8 --clients 8 --max-batch 8 --prefix-tokens 256 --gen-length 32 \
    --repeats 3 --json run$i.json > run$i.txt 2> run$i.log
  uptime >> run$i.txt
done
