#!/usr/bin/env bash
# Helper gemm4 (issue #5, decode FP8 linears): build the GEMM test + benchmark on the GPU machine,
# run the decode-relevant tests, the decode benchmark sweep, then the remaining tests.
# Usage (repo root, on the device): scripts/gpu/gemm4_run.sh [bench-mode: decode|quick|full]
set -u
OUT=${OUT:-/tmp/gemm4_out}
mkdir -p "$OUT"
MODE=${1:-decode}
t0=$(date +%s)
cmake -S . -B build/dev -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release >"$OUT/configure.log" 2>&1 ||
  { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/dev -j16 --target test_gemm_cuda bench_gemm_fp8 >"$OUT/build.log" 2>&1 ||
  { grep -iE "error" "$OUT/build.log" | head -30; tail -20 "$OUT/build.log"; exit 1; }
echo "build done in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
T=build/dev/tests/kernels/test_gemm_cuda
B=build/dev/bench/bench_gemm_fp8
# 1. The new kernel and the decode paths.
timeout 60 "$T" --gtest_filter='*Stream*:*DecodeBatch*:*FlashShapesDecode*:*Rejects*:*Tiny*' \
  >"$OUT/test_decode.log" 2>&1
echo "test_decode rc=$? ($(( $(date +%s) - t0 )) s)"
grep -E "^\[  (FAILED|PASSED|  OK) |worst|Failure|got " "$OUT/test_decode.log" | head -60
# 2. The benchmark sweep.
timeout 85 "$B" "$OUT/gemm_fp8.json" "$MODE" >"$OUT/bench.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"
grep -E "floor|ceilings" "$OUT/bench.log" | head -80
# 3. The rest of the tests, with what time is left.
left=$(( 225 - ($(date +%s) - t0) ))
if [ "$left" -gt 10 ]; then
  timeout "$left" "$T" --gtest_filter='-*Stream*:*DecodeBatch*:*FlashShapesDecode*:*Rejects*:*Tiny*' \
    >"$OUT/test_rest.log" 2>&1
  echo "test_rest rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure" "$OUT/test_rest.log" | head -30
fi
