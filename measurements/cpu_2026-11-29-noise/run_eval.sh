#!/bin/sh
# The embedded uniform-noise model (`embedded-noise`) side by side with the masked `embedded`
# model on the same test prompts: 100 per task (n = 1000 for waiting_line, 200 for puzzles),
# generation length 32, greedy (temperature 0), decoding seed 0, data seed 0. Run from the
# repository root after `python -m recipes.noise` (README.md in this folder).
#   embedded-noise: its shipped decoding (`DecodeConfig.for_model`: `uniform_noise` with the
#     generation_config.json fields, i.e. entropy bound 0.1, 16 steps per 8-token canvas,
#     t 0.8 -> 0.4, stable-and-confident stop, EOS 2); summarize.py checks the run used exactly it;
#   embedded: its shipped decoding (threshold 0.9, whole canvas) and one token per step
#     (low_confidence, 32 steps), the masked model's accuracy ceiling.
set -e
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
HERE=measurements/cpu_2026-11-29-noise
run() {  # model label scheduler...
  model=$1 label=$2
  shift 2
  nice -n 5 dllm-decode eval --model "$model" --tasks all --limit 100 "$@" \
    --no-plots --no-progress --out $HERE/eval/$label
}
run embedded-noise noise-shipped --scheduler uniform_noise:steps=16
run embedded-noise noise-steps48 --scheduler uniform_noise:steps=48   # the reference's default steps
run embedded embedded-t0.9 --scheduler threshold:threshold=0.9
run embedded embedded-k1 --scheduler low_confidence
