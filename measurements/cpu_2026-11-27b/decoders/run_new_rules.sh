#!/usr/bin/env bash
# The three rules with extra forwards beside threshold and low_confidence on the embedded model:
# 12 tasks x 8 prompts (n = 96 per rule), gen 32 (one block), greedy, cache none.
# Output: runs/<rule>/summary.json (kept here as summary_<rule>.json).
set -euo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for rule in threshold low_confidence apd info_gain remdm; do
  dllm-decode eval --model embedded --tasks all --limit 8 --gen-length 32 --scheduler "$rule" \
      --no-plots --no-progress --out "runs/$rule" --json > "summary_$rule.json"
done
