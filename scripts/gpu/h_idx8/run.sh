#!/usr/bin/env bash
# h-idx8 (issue 7, session 8): one device call. Prebuilt binaries in the carry dir
# (scripts/gpu/h_idx8/build_all.sh): the default build and the variants v/NAME (build-time -D
# flags, listed in build_all.sh). Tests (default + the variants that have a test binary),
# compute-sanitizer memcheck on small tests of the default, all benches (graph + graph_hot + SM
# clock probes), ncu of one score launch of the default (--clock-control none: clocks untouched).
# Everything in $OUT/r.tgz (the run returns at most 8 files), the summary last on stdout.
#   DS_COMMIT=... bash build/h8-idx-carry/run.sh
# Run 1 (commit 7828e11) ran an earlier version of this script; run 2 (commit 940da90) this one
# with the variants mma, c4k (tested), uncoal, nobucket, s5.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp/h_idx8_out}"
r="$out/r"
mkdir -p "$r"
export DS_COMMIT="${DS_COMMIT:-h8-idx-unknown}"
export CUDA_VISIBLE_DEVICES=0
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
S="$r/summary.txt"
say() { echo "$*" | tee -a "$S"; }
say "$(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv,noheader | head -1)"
if command -v cuobjdump >/dev/null; then
  timeout 30 cuobjdump -sass "$here/bench_indexer" 2>/dev/null |
    awk '/Function : .*indexer_score_kernelILi8/{p=1} p&&/Function : /&&!/ILi8/{p=0} p' >"$r/sass_score8.txt"
  line="sass default lines $(wc -l <"$r/sass_score8.txt"):"
  for op in QGMMA HGMMA HMMA WARPGROUP LDGSTS BAR SHFL IMAD.HI; do line="$line $op=$(grep -c "$op" "$r/sass_score8.txt")"; done
  say "$line"
  gzip "$r/sass_score8.txt"
fi
rc=0
run_test() {  # name binary
  timeout 60 "$2" >"$r/test_$1.log" 2>&1
  local x=$?
  say "test $1: rc=$x $(grep -E '^\[  (PASSED|FAILED) ' "$r/test_$1.log" | tr '\n' ' ') ($(el)s)"
  [ $x -eq 0 ] || { rc=1; grep -B2 -A8 -m 8 "Failure" "$r/test_$1.log" | head -60 | tee -a "$S"; }
}
run_bench() {  # name binary
  timeout 50 "$2" "$r/indexer_$1.json" >"$r/bench_$1.log" 2>&1 || { rc=$((rc | 2)); say "bench $1 rc!=0"; }
  say "bench $1 done ($(el)s)"
}
run_test default "$here/test_indexer_cuda"
if command -v compute-sanitizer >/dev/null; then
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 "$here/test_indexer_cuda" \
    --gtest_filter='IndexerCuda.Tiny*:IndexerCuda.FlashJustAboveTopk:IndexerCuda.FlashShortAndBoundaryLengths' \
    >"$r/memcheck.log" 2>&1
  say "memcheck default rc=$? $(grep -E 'ERROR SUMMARY' "$r/memcheck.log" | tail -1) ($(el)s)"
fi
run_bench default "$here/bench_indexer"
# Variants with a test binary first (tested + benched), then bench-only ones while time allows.
for d in "$here"/v/*/; do
  n=$(basename "$d")
  [ -x "$d/test_indexer_cuda" ] || continue
  run_test "$n" "$d/test_indexer_cuda"
  run_bench "$n" "$d/bench_indexer"
done
for d in "$here"/v/*/; do
  n=$(basename "$d")
  [ -x "$d/test_indexer_cuda" ] && continue
  [ "$(el)" -lt "${T_EXTRA:-150}" ] && run_bench "$n" "$d/bench_indexer"
done
if command -v ncu >/dev/null && [ "$(el)" -lt "${T_NCU:-170}" ]; then
  timeout 60 ncu --clock-control none -k regex:indexer_score --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy "$here/test_indexer_cuda" \
    --gtest_filter=IndexerCuda.FlashBatch1Context128K >"$r/ncu_default.log" 2>&1
  say "ncu rc=$? ($(el)s)"
fi
say "==== ceilings (default bench)"
grep -E "^ceilings|^launch floor|^latency" "$r/bench_default.log" | tee -a "$S"
say "==== us: main B=1/16/64 x ctx 512,4K,8K,32K,128K | onesplit 4K,8K,32K ctx | maxlen (8K: 4K B1,B64, 8K B1,B64; 1M: same)"
for mode in graph graph_hot; do
  say "-- $mode"
  for f in "$r"/bench_*.log; do
    n=$(basename "$f" .log); n=${n#bench_}
    awk -v n="$n" -v md="$mode" '$7==md && $1=="indexer_select" {m=m sprintf(" %6.1f",$8)}
      $7==md && $1=="indexer_select_onesplit" {o=o sprintf(" %6.1f",$8)}
      $7==md && $1=="indexer_select_maxlen" {x=x sprintf(" %5.1f",$8)}
      END {printf "%-9s%s |%s |%s\n", n, m, o, x}' "$f" | tee -a "$S"
  done
done
say "==== SM MHz after graph / after graph_hot (default bench, main series in order, then onesplit)"
awk '/^clock: main/ {a=a sprintf(" %s/%s", $6, $10)} /^clock: onesplit/ {b=b sprintf(" %s/%s", $6, $10)}
  END {print "main:" a; print "onesplit:" b}' "$r/bench_default.log" | tee -a "$S"
if [ -f "$r/ncu_default.log" ]; then
  say "==== ncu (default, first score launch of FlashBatch1Context128K)"
  grep -E "SM Frequency|DRAM Frequency|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Ipc|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|No Eligible|Memory Throughput|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Block Limit" \
    "$r/ncu_default.log" | head -30 | tee -a "$S"
  grep -iE "stall|est\. speedup" "$r/ncu_default.log" | head -12 | tee -a "$S"
fi
(cd "$out" && tar czf r.tgz r && rm -rf r)
exit $rc
