#!/usr/bin/env bash
# h-moe5 (session 5): one device call for the MoE FP8-path work. Uses the carried binaries
# (build/h-moe5, built locally for sm_90a) or builds them with the kernels-only configuration;
# runs test_moe_cuda, compute-sanitizer memcheck over tiny cases that take the FP8 path, then
# bench_moe; logs and moe.json go to OUT_DIR.
#   scripts/gpu/h_moe5/run.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe5_out}}"
mkdir -p "$out"
bt=build/h-moe5/tests/kernels/test_moe_cuda
bb=build/h-moe5/bench/bench_moe
if ! [ -x "$bt" ] || ! [ -x "$bb" ] || ! "$bt" --gtest_list_tests >/dev/null 2>&1; then
  echo "building"
  b=build/h-moe5-dev
  cmake -S . -B $b -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$out/configure.log" 2>&1
  cmake --build $b -j16 --target test_moe_cuda bench_moe >"$out/build.log" 2>&1 ||
    { grep -m 20 -E "error" "$out/build.log"; exit 1; }
  bt=$b/tests/kernels/test_moe_cuda
  bb=$b/bench/bench_moe
fi
t0=$(date +%s)
timeout "${T_TEST:-150}" "$bt" ${FILTER:+--gtest_filter=$FILTER} >"$out/test_moe_cuda.log" 2>&1
rc_t=$?
t1=$(date +%s)
grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|Expected|Which is|worst" "$out/test_moe_cuda.log" | head -40
grep -E "\] T=" "$out/test_moe_cuda.log" | awk '{print $1,$2,$3,$4,$5,$6,$10,$11,$12}' | sort | uniq -c | sort -k1,1nr | head -5
grep -E "fp8 .*rel\)" "$out/test_moe_cuda.log" | sed 's/ oracle.*max_err/ max_err/' | head -12
rc_s=0
if command -v compute-sanitizer >/dev/null; then
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 "$bt" \
    --gtest_filter='MoeCuda.TinyUniformMxfp4:MoeCuda.TinyHashRouting' >"$out/memcheck.log" 2>&1
  rc_s=$?
  echo "memcheck rc=$rc_s"; grep -E "ERROR SUMMARY|Invalid" "$out/memcheck.log" | head -5
fi
t2=$(date +%s)
timeout "${T_BENCH:-110}" "$bb" "$out/moe.json" >"$out/bench_moe.log" 2>&1
rc_b=$?
t3=$(date +%s)
grep -vE "^route" "$out/bench_moe.log" | sed 's/ distinct=[0-9]* //; s/  */ /g' | cut -c1-150 | tail -45
grep -E "^route" "$out/bench_moe.log"
echo "test rc=$rc_t ($((t1 - t0))s) memcheck rc=$rc_s ($((t2 - t1))s) bench rc=$rc_b ($((t3 - t2))s)"
