#!/usr/bin/env bash
# Wheels for a device machine without network access (torch and numpy already installed there).
#   scripts/gpu_wheels.sh [FOLDER]           einops and safetensors: what scripts/gpu_measure.py needs
#   scripts/gpu_wheels.sh FOLDER 3.11        also transformers, click and pytest with their dependencies
#                                            for CPython 3.11 (the GPU tests, tests/test_gpu.py, load the
#                                            embedded model's tokenizer and call the CLI; the Fast-dLLM v1
#                                            peer's own LLaDA class imports transformers)
# Run where PyPI is reachable, from the repository root; carry the folder to the device and
# install there with: pip install --no-index --find-links FOLDER einops safetensors [transformers click pytest]
set -euo pipefail
out="${1:-.gpu-wheels}"
mkdir -p "$out"
python -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d "$out" einops safetensors
if [ -n "${2:-}" ]; then
  python -m pip download -q --only-binary=:all: --platform manylinux2014_x86_64 --implementation cp \
    --python-version "$2" -d "$out" "transformers>=4.45,<5.40" "click>=8.1" "pytest>=8"
  rm -f "$out"/numpy-*.whl                    # the device's torch brings its own
fi
du -sh "$out"
