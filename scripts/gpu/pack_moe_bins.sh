#!/usr/bin/env bash
# Packs the MoE device-call binaries for scripts/gpu/h_moe18/run.sh (BINS=...): test_moe_cuda and
# bench_moe of the kernels-only sm_90a build (build/h-moe), test_cuda_ops of the full sm_90a build
# (build/cuda90), stripped, with the shared libraries the GPU machine lacks (fmt, spdlog), into
# DEST/bins.tar.xz (an ignored folder under build/, carried by the run tool: carry ["build/cNN"]).
#   scripts/gpu/pack_moe_bins.sh build/c19
# Build first (this machine, nvcc 13.0):
#   cmake -S . -B build/h-moe -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
#     -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release && ninja -C build/h-moe test_moe_cuda bench_moe
#   (after scripts/install_deps.sh) cmake -S . -B build/cuda90 -G Ninja -DDEEPSERVE_CUDA=ON \
#     -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=RelWithDebInfo && ninja -C build/cuda90 test_cuda_ops
set -euo pipefail
cd "$(dirname "$0")/../.."
dest="${1:?usage: pack_moe_bins.sh DEST_DIR (under build/)}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lib" "$dest"
cp build/h-moe/tests/kernels/test_moe_cuda build/h-moe/bench/bench_moe \
  build/cuda90/tests/runtime/test_cuda_ops "$tmp/"
strip "$tmp/test_moe_cuda" "$tmp/bench_moe" "$tmp/test_cuda_ops"
for l in libfmt.so.9 libspdlog.so.1.10; do cp -L "/lib/x86_64-linux-gnu/$l" "$tmp/lib/"; done
tar -C "$tmp" -cf - . | xz -T2 -6 >"$dest/bins.tar.xz"
ls -la "$dest/bins.tar.xz"
