#!/usr/bin/env bash
# h-idx7 (issue 7, session 7): one device call with prebuilt binaries (built on the dev machine in
# the h7-idx worktree, build/k, Release sm_90a; copied next to this script into the carry dir):
# test_indexer_cuda, bench_indexer (default build) and bench_indexer_mb2 (experiment:
# -DDS_INDEXER_SCORE_MIN_BLOCKS=2, see build_mb2.sh). Logs + JSON to $OUT, summary last.
#   bash build/h7-idx-carry/run.sh
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp/h_idx7_out}"
mkdir -p "$out"
export DS_COMMIT="${DS_COMMIT:-h7-idx-unknown}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1
rc=0
t1=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 70 "$here/test_indexer_cuda" >"$out/test_indexer_cuda.log" 2>&1 || rc=1
echo "test: $(( $(date +%s) - t1 ))s rc=$rc"
t2=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 75 "$here/bench_indexer" "$out/indexer.json" >"$out/bench_indexer.log" 2>&1 ||
  rc=$((rc + 2))
echo "bench: $(( $(date +%s) - t2 ))s rc=$rc"
if [ -x "$here/bench_indexer_mb2" ] && [ $(( $(date +%s) - t1 )) -lt 120 ]; then
  t3=$(date +%s)
  CUDA_VISIBLE_DEVICES=0 timeout 60 "$here/bench_indexer_mb2" "$out/indexer_mb2.json" \
    >"$out/bench_indexer_mb2.log" 2>&1 || rc=$((rc + 4))
  echo "bench_mb2: $(( $(date +%s) - t3 ))s rc=$rc"
fi
echo "==== test"
grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) " "$out/test_indexer_cuda.log" | head -30
[ $((rc & 1)) -eq 0 ] || grep -B2 -A6 -m 12 "Failure" "$out/test_indexer_cuda.log" | head -60
echo "==== bench (graph)"
grep -E "ceiling|launch floor" "$out/bench_indexer.log"
grep -E " graph " "$out/bench_indexer.log" | cut -c1-150
if [ -f "$out/bench_indexer_mb2.log" ]; then
  echo "==== bench mb2 (graph)"
  grep -E " graph " "$out/bench_indexer_mb2.log" | grep -E "^indexer_select " | cut -c1-150
fi
exit $rc
