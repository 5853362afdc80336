#!/usr/bin/env bash
# Session 31: per-kernel device times of the indexer (score and merge launches) in bench_indexer's
# cases, under ncu (gpu__time_duration only, caches flushed before each kernel, clocks untouched).
# One bench process per case (DS_INDEXER_CASES), the kernels of its 4th-5th graph-free launches.
# Binaries: build/carry/backend.tar.xz (bench_indexer).
#   CASES="64:8192:main 16:8192:main" scripts/gpu/h_s31/kernel_times.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: kernel_times.sh OUT}"
c=/tmp/carry_s31k
mkdir -p "$out"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
for cs in ${CASES:-1:8192:main 16:8192:main 64:8192:main 16:32768:main 64:32768:main}; do
  DS_INDEXER_CASES="$cs" timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum \
    --kernel-name regex:indexer_ --launch-skip 6 --launch-count 4 --csv \
    "$c/bench_indexer" /tmp/ncu_times.json >"$out/times_${cs//:/_}.csv" 2>"$out/times_${cs//:/_}.err"
  echo "case $cs rc=$?"
  grep -E 'indexer_(score|merge)' "$out/times_${cs//:/_}.csv" |
    awk -F'","' '{for (i = 1; i <= NF; ++i) if ($i ~ /indexer_(score|merge)/) k = $i;
                  v = $NF; gsub(/"/, "", v); sub(/\(.*/, "", k); print "  " k, "grid", $9, v, "ns"}'
done
