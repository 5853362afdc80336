#!/usr/bin/env bash
# Session 31, device call 3 (issue 7): the fused merge with the barrier before the acquire-release
# count (call 2's form raced under racecheck), at <= 4096 candidates. Tests, memcheck + racecheck,
# a repeated run of the fused tests, the base binary (8eeb659, build/carry/bench_indexer_base) and
# two rounds of the tree's bench. At most 8 files in OUT.
#   scripts/gpu/h_s31/call3.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call3.sh OUT}"
mkdir -p /tmp/s31
cases=""
for ctx in 4096 8192 32768 131072; do for b in 1 16 64; do cases+="$b:$ctx:main,"; done; done
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz /tmp/s31/c3 >/dev/null
timeout 200 /tmp/s31/c3/test_indexer_cuda --gtest_repeat=5 \
  --gtest_filter='IndexerCuda.Flash*:IndexerCuda.GraphReplay*:IndexerCuda.Tiny*' \
  >/tmp/s31/repeat.log 2>&1
echo "test_indexer_cuda x5 rc=$? $(grep -c '^\[  FAILED  \]' /tmp/s31/repeat.log) failed lines" \
  >"$out/repeat.txt"
DS_INDEXER_CASES="$cases" timeout 120 build/carry/bench_indexer_base "$out/base.json" \
  >/tmp/s31/base.log 2>&1
echo "base bench rc=$?" >>"$out/repeat.txt"
SANITIZE_FILTER="${SANITIZE_FILTER-IndexerCuda.TinyShapes:IndexerCuda.FlashMixedBatch64:IndexerCuda.GraphReplayWithNewLengths:IndexerCuda.FlashSpeculative4Tokens}" \
  ROUNDS="${ROUNDS:-2}" scripts/gpu/h_s30/call.sh "$out" >"$out/call.txt" 2>&1
rm -f "$out/indexer_table.txt"
{
  cat "$out/repeat.txt"
  python3 scripts/gpu/h_s30/summary.py "$out/base.json" | sed 's/^/base /'
  cat "$out/call.txt"
} >"$out/summary.txt"
cat "$out/summary.txt"
