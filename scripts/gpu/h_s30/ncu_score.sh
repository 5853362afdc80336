#!/usr/bin/env bash
# Session 30 (written for the next device call; not run yet): ncu --set full (clocks untouched,
# PC sampling, source view) of the indexer's score kernel in bench_indexer's case NCU_CASE
# (DS_INDEXER_CASES syntax, default B = 64 at 32K, the tree's defaults): the details page
# (scripts/gpu/ncu_details.py) and the SASS lines with the most stall samples
# (scripts/gpu/ncu_top_sass.py). Binaries: build/carry/backend.tar.xz (bench_indexer).
#   scripts/gpu/h_s30/ncu_score.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: ncu_score.sh OUT}"
c=/tmp/carry_s30n
mkdir -p "$out"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
# The case's eager timing launches the score kernel first; skip a few launches past warm-up.
DS_INDEXER_CASES="${NCU_CASE:-64:32768:main}" timeout 400 ncu --clock-control none --set full --warp-sampling-interval 0 \
  --import-source yes --kernel-name regex:indexer_score_kernel --launch-skip 5 --launch-count 1 \
  -f -o "$out/score" "$c/bench_indexer" /tmp/ncu_bench.json >"$out/ncu_run.log" 2>&1
echo "ncu rc=$?"
scripts/gpu/ncu_summary.sh "$out/score.ncu-rep" "$out" 25
