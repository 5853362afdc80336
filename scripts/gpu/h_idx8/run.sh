#!/usr/bin/env bash
# h-idx8 (issue 7, session 8): the one device call. Prebuilt binaries in the carry dir
# (scripts/gpu/h_idx8/build_all.sh): default = wgmma score path; v/mma = session-7 default;
# v/c4k = wgmma + 4096-key chunks; v/s3 = wgmma with 3 ring stages. Tests (default, mma, c4k),
# compute-sanitizer memcheck on the tiny + one Flash test of the default, benches. Everything in
# $OUT/r.tgz (the run returns at most 8 files), the summary last on stdout.
#   DS_COMMIT=... bash build/h8-idx-carry/run.sh
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
say "$(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader | head -1)"
if command -v cuobjdump >/dev/null; then
  timeout 30 cuobjdump -sass "$here/bench_indexer" 2>/dev/null |
    awk '/Function : .*indexer_score_kernelILi8/{p=1} p&&/Function : /&&!/ILi8/{p=0} p' >"$r/sass_score8.txt"
  line="sass default lines $(wc -l <"$r/sass_score8.txt"):"
  for op in HGMMA HMMA WARPGROUP LDGSTS BAR FENCE; do line="$line $op=$(grep -c "\b$op" "$r/sass_score8.txt")"; done
  say "$line"
  rm -f "$r/sass_score8.txt"
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
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 "$here/test_indexer_cuda" \
    --gtest_filter='IndexerCuda.Tiny*:IndexerCuda.FlashJustAboveTopk' >"$r/memcheck.log" 2>&1
  say "memcheck default rc=$? $(grep -E 'ERROR SUMMARY' "$r/memcheck.log" | tail -1) ($(el)s)"
fi
run_bench default "$here/bench_indexer"
run_test mma "$here/v/mma/test_indexer_cuda"
run_bench mma "$here/v/mma/bench_indexer"
run_test c4k "$here/v/c4k/test_indexer_cuda"
run_bench c4k "$here/v/c4k/bench_indexer"
[ "$(el)" -lt 200 ] && run_bench s3 "$here/v/s3/bench_indexer"
say "==== ceilings (default bench)"
grep -E "^ceilings|^launch floor" "$r/bench_default.log" | tee -a "$S"
say "==== graph us: main B=1/16/64 x ctx 512,4K,8K,32K,128K | onesplit 4K,8K,32K ctx | maxlen"
for f in "$r"/bench_*.log; do
  n=$(basename "$f" .log); n=${n#bench_}
  awk -v n="$n" '$7=="graph" && $1=="indexer_select" {m=m sprintf(" %6.1f",$8)}
    $7=="graph" && $1=="indexer_select_onesplit" {o=o sprintf(" %6.1f",$8)}
    $7=="graph" && $1=="indexer_select_maxlen" {x=x sprintf(" %5.1f",$8)}
    END {printf "%-8s%s |%s |%s\n", n, m, o, x}' "$f" | tee -a "$S"
done
(cd "$out" && tar czf r.tgz r && rm -rf r)
exit $rc
