#!/usr/bin/env bash
# Session 31, device call 2 (issue 7): the tree (prologue loads together, the merge fused into the
# score kernel's last split CTA) against the binary of call 1 (build/carry/bench_indexer_base,
# 8eeb659) in the same call, then the tests, sanitizers and two bench rounds (h_s30/call.sh),
# per-kernel times and the score kernel's profile at B = 64 8K. At most 8 files in OUT.
#   scripts/gpu/h_s31/call2.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call2.sh OUT}"
mkdir -p /tmp/s31
cases=""
for ctx in 4096 8192 32768 131072; do for b in 1 16 64; do cases+="$b:$ctx:main,"; done; done
if [ -x build/carry/bench_indexer_base ]; then
  . scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz /tmp/s31/lib_only >/dev/null
  DS_INDEXER_CASES="$cases" timeout 120 build/carry/bench_indexer_base "$out/base.json" \
    >/tmp/s31/base.log 2>&1
  echo "base bench rc=$?"
fi
SANITIZE_FILTER="${SANITIZE_FILTER-IndexerCuda.TinyShapes:IndexerCuda.FlashMixedBatch64:IndexerCuda.GraphReplayWithNewLengths}" \
  ROUNDS="${ROUNDS:-2}" scripts/gpu/h_s30/call.sh "$out" >"$out/call.txt" 2>&1
CASES="1:8192:main 16:8192:main 64:8192:main 16:32768:main 64:32768:main 16:131072:main" \
  scripts/gpu/h_s31/kernel_times.sh /tmp/s31/times >/tmp/s31/times.txt 2>&1
NCU_CASE=64:8192:main scripts/gpu/h_s30/ncu_score.sh /tmp/s31/ncu >/tmp/s31/ncu.txt 2>&1
ncu --import /tmp/s31/ncu/score.ncu-rep --page source --csv --print-source sass \
  >/tmp/s31/ncu/source.csv 2>/dev/null
cp /tmp/s31/times.txt /tmp/s31/ncu.txt /tmp/s31/ncu/
tar -C /tmp/s31 -czf "$out/profiles.tgz" ncu times
rm -f "$out/logs.tgz.unused"
{
  cat /tmp/s31/times.txt
  head -40 /tmp/s31/ncu.txt
  [ -f "$out/base.json" ] && python3 scripts/gpu/h_s30/summary.py "$out/base.json" | sed 's/^/base /'
  cat "$out/call.txt"
} >"$out/summary.txt"
cat "$out/summary.txt"
rm -f "$out/indexer_table.txt"
