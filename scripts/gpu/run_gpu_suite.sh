#!/usr/bin/env bash
# Builds the CUDA kernels, their tests and benchmarks with the kernels-only preset (needs only
# CUDA + GoogleTest: what the GPU machine has), runs every GPU test, then the benchmarks, and
# prints a one-line-per-step summary last. Made for one call of the GPU machine (10-minute limit):
# the build takes ~3-5 min on 16 cores for sm_90a, the tests ~1 min, the benchmarks ~2-3 min.
#
#   scripts/gpu/run_gpu_suite.sh [OUT_DIR] [--no-bench] [--sanitize]
#
# OUT_DIR (default $OUT, else bench/results) receives the benchmark JSON and the logs.
# --sanitize also runs compute-sanitizer memcheck over a small filter of each test binary.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-bench/results}}"
shift || true
bench=1
sanitize=0
for a in "$@"; do
  case "$a" in
    --no-bench) bench=0 ;;
    --sanitize) sanitize=1 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
# The benchmarks record DS_COMMIT in their JSON (the GPU machine's copy has no .git: pass it).
if [ -z "${DS_COMMIT:-}" ]; then
  DS_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  git diff --quiet HEAD 2>/dev/null || DS_COMMIT="$DS_COMMIT+uncommitted"
fi
export DS_COMMIT
summary=()
step() {  # name, command...
  local name="$1"; shift
  local t0=$(date +%s)
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
  [ $rc -eq 0 ] || tail -20 "$out/$name.log"
  return $rc
}

step configure cmake --preset cuda-kernels || { printf '%s\n' "${summary[@]}"; exit 1; }
step build cmake --build --preset cuda-kernels -j"$(nproc)" --target ds_cuda_all ||
  { grep -m 20 -E "error|Error" "$out/build.log"; printf '%s\n' "${summary[@]}"; exit 1; }

bin=build/cuda-kernels
failed=0
for t in test_kernels_cuda test_gemm_cuda test_ops_cuda test_sparse_mla_cuda \
         test_elementwise_cuda test_indexer_cuda test_moe_cuda; do
  exe=$(find "$bin/tests" -name "$t" -type f | head -1)
  [ -n "$exe" ] || { summary+=("$t: not built"); failed=1; continue; }
  step "$t" "$exe" || failed=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/$t.log" | sed "s/^/    $t: /" | head -5
done
if [ $sanitize -eq 1 ]; then
  for t in test_kernels_cuda test_ops_cuda test_sparse_mla_cuda test_gemm_cuda \
           test_elementwise_cuda; do
    exe=$(find "$bin/tests" -name "$t" -type f | head -1)
    [ -n "$exe" ] && step "memcheck_$t" compute-sanitizer --tool memcheck --error-exitcode 1 \
      "$exe" --gtest_filter='*Tiny*:*tiny*:*Small*' || failed=1
  done
fi
if [ $bench -eq 1 ]; then
  for b in bench_quant_fp8:quant_fp8 bench_gemm_fp8:gemm_fp8 bench_ops:ops \
           bench_sparse_mla:sparse_mla_decode bench_indexer:indexer bench_moe:moe; do
    exe=$(find "$bin/bench" -name "${b%%:*}" -type f | head -1)
    [ -n "$exe" ] && step "${b%%:*}" "$exe" "$out/${b##*:}.json"
  done
fi
echo "---- summary ----"
printf '%s\n' "${summary[@]}"
exit $failed
