#!/usr/bin/env bash
# Session 29: packs already-built binaries of BUILD_DIR (default build/full-cuda, sm_90a) into
# build/carry/backend.tar.xz for call.sh, stripped, with the Debian libraries the GPU machine
# lacks, and the tree's commit in build/carry/COMMIT.
#   scripts/gpu/h_s29/pack.sh [BUILD_DIR] [BIN ...]
set -euo pipefail
cd "$(dirname "$0")/../../.."
bdir="${1:-build/full-cuda}"
shift || true
bins="${*:-deepserve bench_moe test_moe_cuda test_ops_cuda test_cuda_ops}"
stage=build/carry_stage
rm -rf "$stage" && mkdir -p "$stage/lib"
for b in $bins; do
  cp "$(find "$bdir/bin" "$bdir/tests" "$bdir/bench" -name "$b" -type f | head -1)" "$stage/"
done
# shellcheck disable=SC2086
(cd "$stage" && strip $bins)
for lib in libgomp.so.1 libfmt.so.9 libspdlog.so.1.10 libcpp-httplib.so.0.11 libbrotlidec.so.1 \
           libbrotlienc.so.1 libbrotlicommon.so.1; do
  cp -L "/usr/lib/x86_64-linux-gnu/$lib" "$stage/lib/"
done
rm -rf build/carry && mkdir -p build/carry
tar -C "$stage" -cf - . | xz -T2 -9 >build/carry/backend.tar.xz
git rev-parse --short HEAD >build/carry/COMMIT
git diff --quiet HEAD -- src bench tests || echo "+dirty" >>build/carry/COMMIT
rm -rf "$stage"
ls -la build/carry
