#!/usr/bin/env bash
# Session 34: the shortest useful call (the device budget's last minutes): tests of the tree and
# the variants, then the phase traces, then the benches, each line appended to OUT/summary.txt
# as it finishes, so a call cut short still returns what ran.   scripts/gpu/h_s34/lean.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: lean.sh OUT}"
c=/tmp/carry_lean
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
tar -C build/carry -xJf build/carry/variants.tar.xz
sum="$out/summary.txt"
say() { echo "$*" | tee -a "$sum"; }
res() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; }
t0=$(date +%s)
say "gpu: $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader) commit $(cat build/carry/COMMIT)"
timeout 60 "$c/test_sparse_mla_cuda" >/tmp/t.log 2>&1
say "test tree rc=$? $(res /tmp/t.log) ($(( $(date +%s) - t0 )) s)"; grep -E 'Failure' /tmp/t.log | head -5 | tee -a "$sum"
for v in ${LEAN_TESTS:-pp blk1 blk2 pipe}; do
  timeout 60 "build/carry/test_sparse_mla_cuda_$v" >/tmp/t.log 2>&1
  say "test $v rc=$? $(res /tmp/t.log) ($(( $(date +%s) - t0 )) s)"; grep -E 'Failure' /tmp/t.log | head -5 | tee -a "$sum"
done
for v in ${LEAN_TRACES:-trace128 trace128blk1 trace16 trace128pipe}; do
  timeout 40 "build/carry/bench_sparse_mla_$v" /tmp/tr.json quick >/tmp/tr.log 2>&1
  { echo "== $v rc=$?"; python3 scripts/gpu/h_s33/trace_summary.py </tmp/tr.log; } >>"$out/traces.txt" 2>&1
  say "trace $v done ($(( $(date +%s) - t0 )) s)"
done
for v in "" ${LEAN_BENCHES:-_pp _blk1 _pipe _blk2}; do
  b="$c/bench_sparse_mla"; [ -n "$v" ] && b="build/carry/bench_sparse_mla$v"
  timeout 60 "$b" "$out/mla$v.json" quick >/tmp/b.log 2>&1
  { echo "== bench$v rc=$?"; python3 scripts/gpu/h_s32/summary.py "$out/mla$v.json"; } >>"$out/table.txt" 2>&1
  say "bench$v done ($(( $(date +%s) - t0 )) s)"
done
cat "$out/traces.txt" "$out/table.txt" 2>/dev/null | head -150
