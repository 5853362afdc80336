#!/usr/bin/env bash
# Helper h-gemm5 (issue #5, session 5): build the GEMM test + benchmark on the GPU machine, run the
# new paths' tests, the decode sweep (kStream / kBulk layouts, read ceiling), the prefill benchmark
# (cuBLASLt autotuning vs not, tensor-scaled references), then the remaining tests.
# Usage (repo root, on the device): scripts/gpu/h_gemm5/run.sh [time budget s, default 320]
set -u
OUT=${OUT:-/tmp/h_gemm5_out}
mkdir -p "$OUT"
BUDGET=${1:-320}
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
cmake -S . -B build/dev -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
cmake --build build/dev -j16 --target test_gemm_cuda bench_gemm_fp8 >>"$OUT/build.log" 2>&1 ||
  { grep -iE "error" "$OUT/build.log" | head -30; tail -20 "$OUT/build.log"; exit 1; }
echo "build done in $(el) s"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
T=build/dev/tests/kernels/test_gemm_cuda
B=build/dev/bench/bench_gemm_fp8
FIRST='*Bulk*:*CublasLt*:*Rejects*:*StreamKernelDecode*:*DecodeBatch*:*FlashShapesDecode*'
timeout 75 "$T" --gtest_filter="$FIRST" >"$OUT/test_first.log" 2>&1
echo "test_first rc=$? ($(el) s)"
grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure|got " "$OUT/test_first.log" | head -40
grep -E "^bulk .*M=1 |^cublaslt" "$OUT/test_first.log" | head -20
timeout 110 "$B" "$OUT/gemm_fp8_decode.json" decode >"$OUT/bench_decode.log" 2>&1
echo "bench decode rc=$? ($(el) s)"
grep -E "ceilings|read-only" "$OUT/bench_decode.log"
grep -E "floor" "$OUT/bench_decode.log" | sed -E 's/ N=[0-9x]+ K=[0-9]+//' | cut -c1-250
timeout 50 "$B" "$OUT/gemm_fp8.json" prefill >"$OUT/bench_prefill.log" 2>&1
echo "bench prefill rc=$? ($(el) s)"
grep -E "ceilings|block-scaled tuned" "$OUT/bench_prefill.log"
left=$(( BUDGET - $(el) ))
if [ "$left" -gt 10 ]; then
  timeout "$left" "$T" --gtest_filter="-$FIRST" >"$OUT/test_rest.log" 2>&1
  echo "test_rest rc=$? ($(el) s)"
  grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure" "$OUT/test_rest.log" | head -30
else
  echo "test_rest skipped: no time left"
fi
