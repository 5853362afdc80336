#!/usr/bin/env bash
# h-mla7 (session 7, v5): one device call. Runs from the root of the tree the `run` tool ships,
# with the binaries of prepare.sh in build/h8-mla-carry:
#   bash build/h8-mla-carry/run.sh $OUT
# test_sparse_mla_cuda (all), the v5 benchmark (full, JSON), the v4 and no-PDL benchmarks (quick:
# context 32K, batch 1/16/64/128; the no-PDL one only with NOPDL=1), racecheck and memcheck on
# small cases, each under `timeout` and
# skipped when the budget (BUDGET seconds, default 250) would run out. Logs -> $OUT/logs.tgz,
# JSON -> $OUT/*.json, summary printed last.
set -uo pipefail
c="$(cd "$(dirname "$0")" && pwd)"
out="${1:-${OUT:-/tmp/h_mla7_out}}"
mkdir -p "$out/logs"
start=$(date +%s)
left() { echo $((${BUDGET:-250} - ($(date +%s) - start))); }
lim() { local l=$(($(left) - 10)); [ "$l" -gt "$1" ] && l=$1; echo $l; }
step() {  # name limit cmd...
  local name=$1 l; l=$(lim "$2"); shift 2
  if [ "$l" -lt 15 ]; then echo "$name: skipped (budget)"; return; fi
  local t0=$(date +%s)
  timeout "$l" "$@" >"$out/logs/$name.log" 2>&1
  echo "$name rc=$? ($(( $(date +%s) - t0 ))s, limit ${l}s)"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader | head -1
bt=$c/test_sparse_mla_cuda
step test 110 "$bt"
grep -E "^\[ +(OK|FAILED|PASSED) |Failure|Expected|Which is|splits|tiles/step" "$out/logs/test.log" | head -40
q=""; [ "${QUICK:-0}" = 1 ] && q=quick  # QUICK=1: every benchmark in quick mode
step bench_v5 110 "$c/bench_sparse_mla" "$out/sparse_mla_decode.json" $q
step bench_v4 35 "$c/bench_sparse_mla_v4" "$out/sparse_mla_decode_v4_quick.json" quick
if command -v compute-sanitizer >/dev/null; then
  step racecheck 45 compute-sanitizer --tool racecheck --error-exitcode 1 "$bt" \
    --gtest_filter='SparseMlaCuda.TinyShapes:SparseMlaCuda.FlashShortLengthsAndMasks'
  grep -E "RACECHECK SUMMARY|hazard|Error|PASSED|FAILED" "$out/logs/racecheck.log" | head -6
fi
[ "${NOPDL:-0}" = 1 ] &&
  step bench_nopdl 30 "$c/bench_sparse_mla_nopdl" "$out/sparse_mla_decode_nopdl_quick.json" quick
if command -v compute-sanitizer >/dev/null; then
  step memcheck 40 compute-sanitizer --tool memcheck --error-exitcode 1 "$bt" \
    --gtest_filter='SparseMlaCuda.TinyShapes:SparseMlaCuda.ProgrammaticLaunchWaitsForTheProducer:SparseMlaCuda.RejectsBadParams'
  grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$out/logs/memcheck.log" | head -6
fi
# The guard-free pair loop (9c7e537) when carried: its test, racecheck, and full benchmark.
if [ -x "$c/test_sparse_mla_cuda_p2gf" ]; then
  step test_p2gf 60 "$c/test_sparse_mla_cuda_p2gf"
  grep -E "^\[ +(FAILED|PASSED) |Failure|tiles/step" "$out/logs/test_p2gf.log" | head -12
  command -v compute-sanitizer >/dev/null &&
    step racecheck_p2gf 30 compute-sanitizer --tool racecheck --error-exitcode 1 \
      "$c/test_sparse_mla_cuda_p2gf" --gtest_filter='SparseMlaCuda.TinyShapes:SparseMlaCuda.FlashShortLengthsAndMasks'
  grep -E "RACECHECK SUMMARY" "$out/logs/racecheck_p2gf.log" 2>/dev/null
  step bench_p2gf 60 "$c/bench_sparse_mla_p2gf" "$out/sparse_mla_decode_p2gf.json" $q
fi
tar czf "$out/logs.tgz" -C "$out" logs
for t in v5 v4 nopdl p2gf; do
  echo "=== $t (kernel shape mode time floor ratio GB/s TFLOP/s err)"
  grep -E "^(sparse_mla_decode|ceiling)|copy ceiling" "$out/logs/bench_$t.log" 2>/dev/null |
    grep -E "graph|ceiling" | sed -E 's/keys=[0-9]+ //; s/ +/ /g' | cut -c1-90 | head -90
done
rm -rf "$out/logs"
echo "total $(( $(date +%s) - start ))s"
