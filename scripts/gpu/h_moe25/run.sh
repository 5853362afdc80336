#!/usr/bin/env bash
# Session 25: one device call for the MoE prefill GEMMs. The carried binaries (BINS, packed
# stripped: bench_moe of the change, bench_moe_prev of the previous default, bench_moe_old of
# f6f6d69, the last default measured before) fill the 64 MiB carry, so test_moe_cuda is built here
# (kernels-only, 16 cores, niced) while the benches run:
#   1. the GEMM rows of AB_CASES from each bench, interleaved AB_ROUNDS times (same GPU, same run);
#      the last round's JSON of each bench -> OUT/ab_<bench>.json;
#   2. test_moe_cuda (MOE_TEST_FILTER), then compute-sanitizer memcheck of MOE_SANITIZE_FILTER;
#   3. the K loops of the default wgmma kernels of bench_moe and bench_moe_prev (cuobjdump +
#      scripts/gpu/h_moe23/sass_loops.py: length, LDL / STL per loop) -> OUT/sass_loops_<bench>.txt.
#   scripts/gpu/h_moe25/run.sh [OUT_DIR]    env: BINS, AB_CASES, AB_ROUNDS (2), MOE_TEST_FILTER,
#   AB_OLD_ONCE=1 (bench_moe_old in the first round only), MOE_TEST_TIMEOUT (240),
#   MOE_SANITIZE_FILTER (MoeCuda.TinyWide*), MOE_SANITIZE_TIMEOUT (90),
#   GEMM_TEST=1: also build and run test_gemm_cuda (GEMM_TEST_TIMEOUT, 120)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe25_out}}"
mkdir -p "$out"
c=/tmp/c25
. scripts/gpu/unpack_bins.sh && unpack_bins "${BINS:?packed binaries}" "$c"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv >"$out/gpu.txt"
b=build/d-moe
(cmake -S . -B $b -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
   -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release >/tmp/d-moe-configure.log 2>&1 &&
   nice -n 19 cmake --build $b -j"$(nproc)" --target test_moe_cuda ${GEMM_TEST:+test_gemm_cuda} >/tmp/d-moe-build.log 2>&1
 echo $? >/tmp/d-moe-build.rc) &
build_pid=$!

cases="${AB_CASES:-mxfp4:4096:0:0;mxfp4:8192:0:0;nvfp4:4096:0:0}"
for i in $(seq "${AB_ROUNDS:-2}"); do
  for bench in bench_moe_old bench_moe_prev bench_moe; do
    [ -x "$c/$bench" ] || continue
    [ "$bench" = bench_moe_old ] && [ "$i" -gt 1 ] && [ "${AB_OLD_ONCE:-0}" = 1 ] && continue
    echo "== $bench round $i"
    DS_MOE_CASES="$cases" timeout 150 "$c/$bench" "$out/ab_$bench.json" 2>&1 | grep -E "moe_gemms"
  done
done

wait $build_pid
rc_build=$(cat /tmp/d-moe-build.rc 2>/dev/null || echo 1)
echo "test_moe_cuda build rc=$rc_build"
rc_t=1 rc_s=1
if [ "$rc_build" = 0 ]; then
  t=$b/tests/kernels/test_moe_cuda
  timeout "${MOE_TEST_TIMEOUT:-240}" "$t" ${MOE_TEST_FILTER:+--gtest_filter=$MOE_TEST_FILTER} \
    >"$out/test_moe_cuda.log" 2>&1
  rc_t=$?
  grep -E "^\[ +(FAILED|PASSED) |Failure|Expected|Which is|first mismatching" "$out/test_moe_cuda.log" |
    head -30
  sf="${MOE_SANITIZE_FILTER:-MoeCuda.TinyWide*}"
  timeout "${MOE_SANITIZE_TIMEOUT:-90}" compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$t" --gtest_filter="$sf" >"$out/memcheck_moe.log" 2>&1
  rc_s=$?
  echo "memcheck ($sf) rc=$rc_s"
  grep -E "ERROR SUMMARY|Invalid" "$out/memcheck_moe.log" | head -5
else
  grep -m 20 -E "error" /tmp/d-moe-build.log
fi
rc_g=0
if [ -n "${GEMM_TEST:-}" ] && [ "$rc_build" = 0 ]; then  # linear_fp8 (its mbarrier helpers moved)
  timeout "${GEMM_TEST_TIMEOUT:-120}" $b/tests/kernels/test_gemm_cuda >"$out/test_gemm_cuda.log" 2>&1
  rc_g=$?
  echo "test_gemm_cuda rc=$rc_g $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_gemm_cuda.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/test_gemm_cuda.log" | head
fi
cuobj="$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)"
if [ -n "$cuobj" ]; then
  for bench in bench_moe bench_moe_prev; do
    [ -x "$c/$bench" ] || continue
    "$cuobj" -sass "$c/$bench" >"/tmp/$bench.sass" 2>/dev/null
    for k in 'expert_gemm_wg_kernelILb1ELi1ELi4ELb0' 'expert_gemm_wg_kernelILb0ELi1ELi4ELb0'; do
      python3 scripts/gpu/h_moe23/sass_loops.py "$k" <"/tmp/$bench.sass" >>"$out/sass_loops_$bench.txt"
    done
    echo "sass $bench (per kernel: instructions, LDL/STL; per K loop: width:length/LDL):"
    python3 -c '
import re, sys
for line in open(sys.argv[1]):
    m = re.search(r"(expert_gemm_wg_kernel\w{0,24}).*: (\d+) instructions, (\d+) LDL", line)
    if m:
        print("\n ", m.group(1), m.group(2), m.group(3), end=" |")
    m = re.search(r": (\d+) instr, HGMMA \d+ \(n(\d+)\), LDL (\d+)", line)
    if m:
        print(" n%s:%s/%s" % (m.group(2), m.group(1), m.group(3)), end="")
print()' "$out/sass_loops_$bench.txt"
  done
fi
echo "test_moe_cuda rc=$rc_t  memcheck rc=$rc_s  test_gemm_cuda rc=$rc_g"
[ "$rc_t" = 0 ] && [ "$rc_s" = 0 ] && [ "$rc_g" = 0 ]
