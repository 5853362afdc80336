#!/usr/bin/env bash
# Session 25's short call (the device budget was nearly spent on refused starts): one bench_moe and
# one test_moe_cuda of the change, both carried (BINS), no build on the device. The same-binary
# A/B of the default wgmma prefill tiles against pf_step 8 / 32 and pf_sync 1 (AB_ROUNDS runs of
# the AB_CASES rows; the last run's JSON -> OUT/moe_s25.json), then the bit-for-bit and division
# tests (TEST_FILTER).
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe25_short}}"
mkdir -p "$out"
c=/tmp/c44
. scripts/gpu/unpack_bins.sh && unpack_bins "${BINS:?packed binaries}" "$c"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv >"$out/gpu.txt"
for i in $(seq "${AB_ROUNDS:-2}"); do
  echo "== bench_moe round $i"
  DS_MOE_CASES="${AB_CASES:?}" timeout 80 "$c/bench_moe" "$out/moe_s25.json" 2>&1 |
    grep -E "moe_gemms|^ceilings"
done
filter="${TEST_FILTER:-MoeSiluDivision.*:MoeCuda.TinyWide*:MoeCuda.WgmmaWide*}"
timeout "${TEST_TIMEOUT:-60}" "$c/test_moe_cuda" --gtest_filter="$filter" >"$out/test_moe_cuda.log" 2>&1
rc=$?
grep -E "^\[ +(OK|FAILED|PASSED) |Failure|first mismatching" "$out/test_moe_cuda.log" | head -20
echo "test_moe_cuda rc=$rc"
exit $rc
