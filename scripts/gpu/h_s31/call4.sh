#!/usr/bin/env bash
# Session 31, device call 4 (issue 7): the merges' bounded radix search (series nobound = off).
# Tests, memcheck + racecheck, a repeated run of the Flash and graph tests, two bench rounds.
#   scripts/gpu/h_s31/call4.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call4.sh OUT}"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz /tmp/s31/c4 >/dev/null
timeout 200 /tmp/s31/c4/test_indexer_cuda --gtest_repeat=3 \
  --gtest_filter='IndexerCuda.Flash*:IndexerCuda.GraphReplay*' >"$out/repeat.log" 2>&1
echo "test_indexer_cuda x3 rc=$? $(grep -c '^\[  FAILED  \]' "$out/repeat.log") failed lines" \
  >"$out/summary.txt"
SANITIZE_FILTER="${SANITIZE_FILTER-IndexerCuda.FlashMixedBatch64:IndexerCuda.GraphReplayWithNewLengths:IndexerCuda.FlashSpeculative4Tokens}" \
  ROUNDS="${ROUNDS:-2}" scripts/gpu/h_s30/call.sh "$out" >"$out/call.txt" 2>&1
rm -f "$out/indexer_table.txt"
cat "$out/call.txt" >>"$out/summary.txt"
cat "$out/summary.txt"
