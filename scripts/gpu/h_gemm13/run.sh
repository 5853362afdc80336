#!/usr/bin/env bash
# h-gemm13 (issue 5, session 13): one device call. Prebuilt kernels-only binaries in build/g13
# (test_gemm_cuda, bench_gemm_fp8 from build/k): the whole GEMM test binary, then bench_gemm_fp8
# "tiled" (with DS_KPARTS=1: the three 33 MB projections and the k_parts sweep; run 3). Runs 1-2
# ran the "ksplit" mode of commit 444fa24 (cluster vs global K split; DS_KSPLIT_STAGES=1 added
# the ring-depth sweep), removed with the global split.
#   OUT=... DS_COMMIT=... [DS_KPARTS=1] bash scripts/gpu/h_gemm13/run.sh [tests|tiled|prefill ...]
set -uo pipefail
cd "$(dirname "$0")/../../.."
b=build/g13
out="${OUT:-/tmp/h_gemm13_out}"
mkdir -p "$out"
export DS_COMMIT="${DS_COMMIT:-h-gemm13}"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
S="$out/summary.txt"
say() { echo "$*" | tee -a "$S"; }
say "$(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv,noheader | head -1)"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(tests tiled)
rc=0
for st in "${steps[@]}"; do
  case $st in
    tests)
      timeout 240 "$b/test_gemm_cuda" >"$out/test_gemm.log" 2>&1
      x=$?
      say "test_gemm_cuda: rc=$x $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_gemm.log" | tr '\n' ' ') ($(el)s)"
      [ $x -eq 0 ] || { rc=1; grep -E '^\[  FAILED' "$out/test_gemm.log" | tee -a "$S"; grep -B2 -A8 -m 8 "Failure" "$out/test_gemm.log" | head -60 | tee -a "$S"; }
      grep -E "^\[       OK \]" "$out/test_gemm.log" | sed 's/.*GemmCudaTest\.//' | tr '\n' ' ' | cut -c1-900 | tee -a "$S"; echo | tee -a "$S"
      ;;
    ksplit | tiled | prefill | decode)
      timeout $([ $st = prefill ] && echo 130 || echo 300) "$b/bench_gemm_fp8" "$out/gemm_fp8_$st.json" "$st" >"$out/bench_$st.log" 2>&1 || { rc=$((rc | 2)); say "bench $st rc!=0"; }
      say "bench $st done ($(el)s)"
      ;;
  esac
done
for st in "${steps[@]}"; do
  [ -f "$out/bench_$st.log" ] || continue
  say "== $st"
  grep -E "^ceilings|floor .* us \||block-scaled tuned .* us \(" "$out/bench_$st.log" | cut -c1-400 | tee -a "$S" >/dev/null
done
cat "$S"
exit $rc
