#!/bin/bash
# Eager decode speed, main (7c42f41) vs this branch, interleaved: ROUNDS rounds, each one
# subprocess per checkout (its own venv's editable install) running eager_bench.py (5 timed
# decodes per configuration, median).
# Usage: measurements/loop_refactor/interleave.sh MAIN_CHECKOUT ROUNDS OUT
main=$1; rounds=$2; out=$3
here=$(cd "$(dirname "$0")/../.." && pwd)
: > "$out"
for r in $(seq "$rounds"); do
  for side in main branch; do
    root=$([ $side = main ] && echo "$main" || echo "$here")
    result=$(cd /tmp && OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 "$root/.venv/bin/python" \
             "$here/measurements/loop_refactor/eager_bench.py")
    echo "{\"round\": $r, \"side\": \"$side\", \"result\": $result}" >> "$out"
  done
done
