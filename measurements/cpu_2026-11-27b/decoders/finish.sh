#!/bin/sh
# Merge the sweep samples into embedded/ (samples are keyed, so a merge never double counts),
# then the combined summary, the frontier plot and the side-by-side table.
set -e
D=measurements/cpu_2026-11-27b/decoders
cat $D/embedded_sweep/samples.jsonl >> $D/embedded/samples.jsonl
nice -n 10 dllm-decode eval --model embedded --tasks all --limit 4 --gen-length 256 --block-length 32 \
    --scheduler low_confidence --no-progress --out $D/embedded --combine --plots > $D/embedded/combined.txt
python -m dllm_decode.eval.tune.compare $D/embedded > /dev/null
