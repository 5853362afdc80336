#!/usr/bin/env bash
# MoE on the GPU (kernels/cuda/moe): runs test_moe_cuda, then bench_moe, in one device call.
# Uses prebuilt binaries when they were carried (build/h-moe/..., built locally for sm_90a), else
# builds both with the kernels-only configuration first (~2 min on 16 cores).
#
#   scripts/gpu/run_moe.sh [OUT_DIR]      (OUT_DIR default $OUT, else bench/results)
# Env: MOE_TEST_FILTER (gtest filter), MOE_TEST_TIMEOUT / MOE_BENCH_TIMEOUT (seconds),
# MOE_SANITIZE=1 (compute-sanitizer memcheck over MOE_SANITIZE_FILTER, default MoeCuda.Tiny*,
# within MOE_SANITIZE_TIMEOUT seconds, default 90), MOE_SKIP_BENCH=1 (tests only).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-bench/results}}"
mkdir -p "$out"
bin_test=${MOE_TEST_BIN:-build/h-moe/tests/kernels/test_moe_cuda}
bin_bench=${MOE_BENCH_BIN:-build/h-moe/bench/bench_moe}
if ! [ -x "$bin_test" ] || ! [ -x "$bin_bench" ] || ! "$bin_test" --gtest_list_tests >/dev/null 2>&1; then
  echo "building test_moe_cuda and bench_moe"
  b=build/moe-dev
  cmake -S . -B $b -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release >"$out/configure.log" 2>&1
  cmake --build $b -j"$(nproc)" --target test_moe_cuda bench_moe >"$out/build.log" 2>&1 ||
    { grep -m 20 -E "error" "$out/build.log"; exit 1; }
  bin_test=$b/tests/kernels/test_moe_cuda
  bin_bench=$b/bench/bench_moe
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv \
  >"$out/gpu.txt" 2>&1
t0=$(date +%s)
timeout "${MOE_TEST_TIMEOUT:-110}" "$bin_test" ${MOE_TEST_FILTER:+--gtest_filter=$MOE_TEST_FILTER} \
  >"$out/test_moe_cuda.log" 2>&1
rc_t=$?
t1=$(date +%s)
grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |\] T=|Failure|error|Expected|Which is|worst" \
  "$out/test_moe_cuda.log" | head -80
rc_s=0
if [ "${MOE_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  sf="${MOE_SANITIZE_FILTER:-MoeCuda.Tiny*}"
  timeout "${MOE_SANITIZE_TIMEOUT:-90}" compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$bin_test" --gtest_filter="$sf" >"$out/memcheck_moe.log" 2>&1
  rc_s=$?
  echo "memcheck ($sf) rc=$rc_s"; grep -E "ERROR SUMMARY|Invalid" "$out/memcheck_moe.log" | head -5
fi
rc_b=0
if [ "${MOE_SKIP_BENCH:-0}" != 1 ]; then
  timeout "${MOE_BENCH_TIMEOUT:-100}" "$bin_bench" "$out/moe.json" >"$out/bench_moe.log" 2>&1
  rc_b=$?
fi
t2=$(date +%s)
[ -f "$out/bench_moe.log" ] && tail -25 "$out/bench_moe.log"
echo "test_moe_cuda rc=$rc_t ($((t1 - t0))s)  memcheck rc=$rc_s  bench_moe rc=$rc_b ($((t2 - t1))s)"
[ $rc_t -eq 0 ] && [ $rc_s -eq 0 ] && [ $rc_b -eq 0 ]
