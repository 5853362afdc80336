#!/usr/bin/env bash
# Session 31, device call 1 (issue 7): session 30's call (tests, sanitizers, bench_indexer) on the
# crowded-merge cap's tree, then per-kernel times (kernel_times.sh) and the score kernel's ncu
# profile (h_s30/ncu_score.sh). Binaries: build/carry/backend.tar.xz.
#   scripts/gpu/h_s31/call1.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call1.sh OUT}"
SANITIZE_FILTER="${SANITIZE_FILTER-IndexerCuda.TinyShapes:IndexerCuda.FlashMixedBatch64}" \
  ROUNDS="${ROUNDS:-2}" scripts/gpu/h_s30/call.sh "$out" >"$out/call.txt" 2>&1
scripts/gpu/h_s31/kernel_times.sh "$out/times" >"$out/times.txt" 2>&1
[ "${NCU_SCORE:-1}" = 1 ] && scripts/gpu/h_s30/ncu_score.sh "$out/ncu" >"$out/ncu.txt" 2>&1
cat "$out/times.txt"
[ -f "$out/ncu.txt" ] && head -60 "$out/ncu.txt"
cat "$out/call.txt"
