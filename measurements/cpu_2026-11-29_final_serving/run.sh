#!/bin/sh
# The task workload of `bench serving` on final main (packing, the serving-overhead changes):
# ROUNDS runs of the default command, each printing its ratios measured side by side in that run
# (the server at concurrency 1 and concurrent, against the offline one-at-a-time decode).
# `python summary.py` prints the medians and ranges.
set -e
cd "$(dirname "$0")"
mkdir -p runs
for i in $(seq 1 "${ROUNDS:-6}"); do
  (cd /tmp && OMP_NUM_THREADS=1 dllm-decode bench serving --requests 320 --clients 64 --max-batch 32 \
    --json "$OLDPWD/runs/tasks$i.json") > runs/tasks$i.txt 2> runs/tasks$i.log
  uptime >> runs/tasks$i.txt
done
