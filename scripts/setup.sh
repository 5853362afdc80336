#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: install dependencies, build the CPU configuration
# (and the CUDA one when nvcc and a GPU are present). Prints where the binary is.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
jobs=$(nproc)
cmake --preset cpu-release >/dev/null
cmake --build --preset cpu-release -j"$jobs"
if { [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; } &&
   nvidia-smi -L >/dev/null 2>&1; then
  cmake --preset cuda-release >/dev/null
  cmake --build --preset cuda-release -j"$jobs"
fi
echo "setup: built build/cpu-release/bin/deepserve"
