#!/usr/bin/env bash
# h-gemm12 (issue 5, session 12): one device call. Prebuilt kernels-only binaries in build/g12
# (test_gemm_cuda, bench_gemm_fp8 from build/k): the GEMM tests (the tile-order ones first), then
# bench_gemm_fp8 "tiled" (row-major vs tile-ordered weights, kStream / kBulk sweeps, M = 1..16)
# and "prefill" (the five attention projections against cuBLASLt's tensor-scaled rate).
#   OUT=... DS_COMMIT=... bash scripts/gpu/h_gemm12/run.sh [tests|tiled|prefill ...]
set -uo pipefail
cd "$(dirname "$0")/../../.."
b=build/g12
out="${OUT:-/tmp/h_gemm12_out}"
mkdir -p "$out"
export DS_COMMIT="${DS_COMMIT:-h-gemm12}"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
S="$out/summary.txt"
say() { echo "$*" | tee -a "$S"; }
say "$(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv,noheader | head -1)"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tiled tests prefill)
rc=0
for st in "${steps[@]}"; do
  case $st in
    tests)
      timeout 150 "$b/test_gemm_cuda" --gtest_filter='*Tile*:*Tiled*:*RejectsBadShapes*:*StreamKernelDecodeShapes*:*BulkKernelDecodeShapes*' >"$out/test_gemm.log" 2>&1
      x=$?
      say "test_gemm_cuda (tiled subset): rc=$x $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_gemm.log" | tr '\n' ' ') ($(el)s)"
      [ $x -eq 0 ] || { rc=1; grep -B2 -A8 -m 8 "Failure" "$out/test_gemm.log" | head -60 | tee -a "$S"; }
      grep "^tiled " "$out/test_gemm.log" | sort -k5 -g | tail -3 | tee -a "$S"
      ;;
    tiled | prefill | decode)
      timeout $([ $st = tiled ] && echo 300 || echo 130) "$b/bench_gemm_fp8" "$out/gemm_fp8_$st.json" "$st" >"$out/bench_$st.log" 2>&1 || { rc=$((rc | 2)); say "bench $st rc!=0"; }
      say "bench $st done ($(el)s)"
      ;;
  esac
done
for st in "${steps[@]}"; do
  [ -f "$out/bench_$st.log" ] || continue
  say "== $st"
  grep -E "^ceilings|floor .* us \||block-scaled tuned .* us \(" "$out/bench_$st.log" | cut -c1-330 | tee -a "$S" >/dev/null
done
cat "$S"
exit $rc
