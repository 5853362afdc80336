#!/usr/bin/env bash
# Helper h-gemm7 (issue #5, session 7): runs the GEMM test + benchmark binaries built on the
# workstation (sm_90a, CUDA statically linked) and carried in build/h7-gemm-carry: the tests of the
# changed paths first (kPersist, GemmRunner's cuBLASLt routing of decode batches, the runner's
# decode shapes), the focused decode sweep (`bench_gemm_fp8 ... persist`: the engine path
# (GemmRunner) vs small-M kAuto vs every kPersist layout and producer count vs cuBLASLt at
# M = 1..64, read ceilings), then further tests while time is left. Prints a summary last.
# Usage (repo root, on the device): bash build/h7-gemm-carry/run.sh [time budget s, default 40]
set -u
OUT=${OUT:-/tmp/h_gemm7_out}
mkdir -p "$OUT"
BUDGET=${1:-40}
D=$(dirname "$0")
export DS_COMMIT=${DS_COMMIT:-$(cat "$D/commit" 2>/dev/null || echo unknown)}
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
T=$D/test_gemm_cuda
B=$D/bench_gemm_fp8
FIRST='*Persist*:*RejectsBadShapes*:*DecodeCublasLtRange*:*DecodeBatch*:*FlashShapesDecode*'
timeout 30 "$T" --gtest_filter="$FIRST" >"$OUT/test_first.log" 2>&1
echo "test_first rc=$? ($(el) s)"
timeout 40 "$B" "$OUT/gemm_fp8_decode.json" persist >"$OUT/bench_persist.log" 2>&1
echo "bench persist rc=$? ($(el) s)"
left=$(( BUDGET - $(el) ))
SECOND='*StreamKernelDecode*:*BulkKernelDecode*:*SmallMKernelFp32*:*TinyShapes*'
if [ "$left" -gt 8 ]; then
  timeout "$left" "$T" --gtest_filter="$SECOND" >"$OUT/test_second.log" 2>&1
  echo "test_second rc=$? ($(el) s)"
else
  echo "test_second skipped: no time left"
fi
echo "=== test_first"
grep -E "^\[  (FAILED|PASSED) |^\[       OK|Failure|got " "$OUT/test_first.log" | head -25
echo "=== test_second"
grep -E "^\[  (FAILED|PASSED) |Failure|got " "$OUT/test_second.log" 2>/dev/null | head -10
echo "=== bench"
grep -E "ceilings|cuBLASLt:" "$OUT/bench_persist.log" | head -8
grep -E "sweep.* P=" "$OUT/bench_persist.log" | awk '{print $2,$3,$8,$9,$10,$11,$13}' | paste - - - | head -40
sed -n '/persist summary/,$p' "$OUT/bench_persist.log" | grep -v "results written" | cut -c1-250
