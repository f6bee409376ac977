#!/bin/sh
# Requests joining running batches in the engine, own windows / held joins against the old
# behaviour, side by side in one process per run (see run.py's docstring).
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
nice -n 10 python measurements/cpu_2026-11-29_joininvar/run.py --rounds 6 --requests 64 --max-batch 16 \
    --block-length 4 --out measurements/cpu_2026-11-29_joininvar/block4.json > measurements/cpu_2026-11-29_joininvar/block4.log 2>&1
nice -n 10 python measurements/cpu_2026-11-29_joininvar/run.py --rounds 6 --requests 64 --max-batch 16 \
    --block-length 8 --out measurements/cpu_2026-11-29_joininvar/block8.json > measurements/cpu_2026-11-29_joininvar/block8.log 2>&1
