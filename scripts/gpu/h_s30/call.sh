#!/usr/bin/env bash
# Session 30: one device call for the lightning indexer (issue 7), binaries carried in
# build/carry/backend.tar.xz (scripts/gpu/h_s29/pack.sh build/full-cuda test_indexer_cuda
# bench_indexer test_cuda_ops), nothing built there:
#   1. test_indexer_cuda and the whole-model GPU tests (test_cuda_ops; TESTS overrides the list);
#   2. compute-sanitizer memcheck and racecheck of SANITIZE_FILTER (test_indexer_cuda cases);
#   3. bench_indexer -> OUT/indexer.json (BENCH=0 skips; ROUNDS=n repeats it into
#      indexer_r<n>.json) and summary.py's tables.
#   scripts/gpu/h_s30/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call.sh OUT}"
c=/tmp/carry_s30
mkdir -p "$out/logs"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader >"$out/gpu.txt"
summary=("gpu: $(cat "$out/gpu.txt")")
t0=$(date +%s)
for t in ${TESTS-test_indexer_cuda test_cuda_ops}; do
  timeout 300 "$c/$t" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$out/logs/$t.log" 2>&1
  summary+=("$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/logs/$t.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)")
  grep -E '^\[  FAILED  \]|Failure' "$out/logs/$t.log" | head -20
done
if [ -n "${SANITIZE_FILTER-}" ]; then
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 "$c/test_indexer_cuda" \
      --gtest_filter="$SANITIZE_FILTER" >"$out/logs/$tool.log" 2>&1
    summary+=("$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$out/logs/$tool.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)")
  done
fi
if [ "${BENCH:-1}" = 1 ]; then
  for r in $(seq "${ROUNDS:-1}"); do  # round r > 1 -> indexer_r<r>.json, its table appended
    j="$out/indexer.json"
    [ "$r" -gt 1 ] && j="$out/indexer_r$r.json"
    timeout 280 "$c/bench_indexer" "$j" >"$out/logs/bench_indexer_r$r.log" 2>&1
    summary+=("bench_indexer round $r rc=$? ($(( $(date +%s) - t0 )) s)")
    python3 scripts/gpu/h_s30/summary.py "$j" >>"$out/indexer_table.txt" 2>&1
  done
fi
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
[ -f "$out/indexer_table.txt" ] && cat "$out/indexer_table.txt"
printf '%s\n' "${summary[@]}"
