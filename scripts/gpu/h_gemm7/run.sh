#!/usr/bin/env bash
# Helper h-gemm7 (issue #5, session 7): runs the GEMM test + benchmark binaries built on the
# workstation (sm_90a, CUDA statically linked) and carried in build/h7-gemm-carry: the tests of
# GemmRunner's decode routing (cuBLASLt for wq_b M >= 9 / wo_b M >= 17) and of the decode paths,
# the decode comparison (`bench_gemm_fp8 <json> batch`: engine path vs small-M kAuto vs cuBLASLt at
# M = 1..64, read ceilings), then the remaining decode tests while time is left; summary last.
# (Runs h-gemm7-1 / -2 ran this script's earlier versions at commits 3060ef2 / bbb9317, with the
# since-removed kPersist kernel and the bench mode `persist`.)
# Usage (repo root, on the device): bash build/h7-gemm-carry/run.sh [time budget s, default 60]
set -u
OUT=${OUT:-/tmp/h_gemm7_out}
mkdir -p "$OUT"
BUDGET=${1:-60}
D=$(dirname "$0")
export DS_COMMIT=${DS_COMMIT:-$(cat "$D/commit" 2>/dev/null || echo unknown)}
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
T=$D/test_gemm_cuda
B=$D/bench_gemm_fp8
FIRST='*DecodeCublasLtRange*:*DecodeBatch*:*FlashShapesDecode*:*RejectsBadShapes*'
timeout 40 "$T" --gtest_filter="$FIRST" >"$OUT/test_first.log" 2>&1
echo "test_first rc=$? ($(el) s)"
timeout 40 "$B" "$OUT/gemm_fp8_decode.json" batch >"$OUT/bench_batch.log" 2>&1
echo "bench batch rc=$? ($(el) s)"
left=$(( BUDGET - $(el) ))
SECOND='*StreamKernelDecode*:*BulkKernelDecode*:*SmallMKernelFp32*:*TinyShapes*:*CublasLtBlockScaled*'
if [ "$left" -gt 8 ]; then
  timeout "$left" "$T" --gtest_filter="$SECOND" >"$OUT/test_second.log" 2>&1
  echo "test_second rc=$? ($(el) s)"
else
  echo "test_second skipped: no time left"
fi
echo "=== test_first"
grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure|got " "$OUT/test_first.log" | head -25
echo "=== test_second"
grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure|got " "$OUT/test_second.log" 2>/dev/null | head -12
echo "=== bench"
grep -E "ceilings|cuBLASLt:" "$OUT/bench_batch.log" | head -8
sed -n '/batch summary/,$p' "$OUT/bench_batch.log" | grep -v "results written" | cut -c1-200
