#!/usr/bin/env bash
# h-idx7 (issue 7, session 7): the one device call of the session's second round. Prebuilt
# binaries (scripts/gpu/h_idx7/build_all.sh, dev machine, Release sm_90a) in the carry dir:
# default test + bench, and variants v/NAME/ (build-time -D experiments, NOTES.md): candidates
# with their own test, diagnostic leave-one-out builds with bench only. Logs in $OUT (one tar),
# JSONs in $OUT, compact summary last.
#   DS_COMMIT=... bash build/h7-idx-carry/run.sh
# Run 2 (2026-12-01) lost logs.tgz: the run tool returns at most 8 files from $OUT and the 11
# JSONs came first. Next time keep <= 7 JSONs (or tar them) so the log tarball comes back.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp/h_idx7_out}"
logs="$out/logs"
mkdir -p "$logs"
export DS_COMMIT="${DS_COMMIT:-h7-idx-unknown}"
export CUDA_VISIBLE_DEVICES=0
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader | head -1
# SASS of the 64-head score kernel: which instructions the two MMA paths become.
for b in "$here/bench_indexer" "$here/v/f16/bench_indexer"; do
  n=$( [ "$b" = "$here/bench_indexer" ] && echo default || echo f16 )
  timeout 30 cuobjdump -sass "$b" 2>/dev/null |
    awk '/Function : .*indexer_score_kernelILi8/{p=1} p&&/Function : /&&!/ILi8/{p=0} p' \
      >"$logs/sass_score8_$n.txt"
  printf "sass %-8s lines %6s:" "$n" "$(wc -l <"$logs/sass_score8_$n.txt")"
  for op in QMMA HMMA F2FP I2F F2F LDGSTS LDG BAR; do
    printf " %s=%s" "$op" "$(grep -c "\b$op" "$logs/sass_score8_$n.txt")"
  done
  echo
done
rc=0
run_test() {  # name binary
  timeout 40 "$2" >"$logs/test_$1.log" 2>&1
  local r=$?
  echo "test $1: rc=$r $(grep -E '^\[  (PASSED|FAILED) ' "$logs/test_$1.log" | tr '\n' ' ') ($(el)s)"
  [ $r -eq 0 ] || { rc=1; grep -B2 -A6 -m 6 "Failure" "$logs/test_$1.log" | head -40; }
}
run_bench() {  # name binary
  timeout 40 "$2" "$out/indexer_$1.json" >"$logs/bench_$1.log" 2>&1 || rc=$((rc | 2))
}
run_test default "$here/test_indexer_cuda"
run_bench default "$here/bench_indexer"
mv "$out/indexer_default.json" "$out/indexer.json" 2>/dev/null
for n in f16 f16pa3 pa3; do
  [ -x "$here/v/$n/test_indexer_cuda" ] && run_test "$n" "$here/v/$n/test_indexer_cuda"
  run_bench "$n" "$here/v/$n/bench_indexer"
done
for n in mb2 nopage noload nomma noselect f16nopage f16noselect; do
  [ "$(el)" -lt 170 ] && run_bench "$n" "$here/v/$n/bench_indexer"
done
if [ "$(el)" -lt 150 ]; then
  timeout 45 ncu --clock-control none -k regex:indexer_score --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis "$here/test_indexer_cuda" \
    --gtest_filter=IndexerCuda.FlashBatch1Context128K >"$logs/ncu_default.log" 2>&1
  echo "ncu rc=$? ($(el)s)"
fi
(cd "$out" && tar czf logs.tgz logs && rm -rf logs)
echo "==== default bench: ceilings + microbenchmarks"
tar xzf "$out/logs.tgz" -C /tmp && L=/tmp/logs
grep -E "^ceilings|^launch floor|^latency" "$L/bench_default.log"
echo "==== graph us: main B=1/16/64 x ctx 512,4K,8K,32K,128K | onesplit 1K,2K,8K entries | maxlen"
for f in "$L"/bench_*.log; do
  n=$(basename "$f" .log); n=${n#bench_}
  awk -v n="$n" '$7=="graph" && $1=="indexer_select" {m=m sprintf(" %6.1f",$8)}
    $7=="graph" && $1=="indexer_select_onesplit" {o=o sprintf(" %6.1f",$8)}
    $7=="graph" && $1=="indexer_select_maxlen" {x=x sprintf(" %5.1f",$8)}
    END {printf "%-11s%s |%s |%s\n", n, m, o, x}' "$f"
done
grep -E "^ceilings" "$L"/bench_*.log | sed 's/.*bench_//' | head -12
if [ -f "$L/ncu_default.log" ]; then
  echo "==== ncu (default, first score launch of FlashBatch1Context128K)"
  grep -E "Stall|stall|Issued|Eligible|Active Warps|Duration|Throughput|Pipe|Warp Cycles" \
    "$L/ncu_default.log" | head -40
  tail -5 "$L/ncu_default.log"
fi
exit $rc
