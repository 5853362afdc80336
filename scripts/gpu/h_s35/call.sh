#!/usr/bin/env bash
# Session 35, second call: scripts/gpu/h_s34/call.sh (tree tests + sanitizers, the variants'
# tests and benches, traces) with a second round of the tree's bench (ROUNDS=2), then a second
# round of every variant bench, appended to OUT/table.txt.   scripts/gpu/h_s35/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call.sh OUT}"
ROUNDS=${ROUNDS:-2} TESTS_OPS=${TESTS_OPS:-0} bash scripts/gpu/h_s34/call.sh "$out"
for b in build/carry/bench_sparse_mla_*; do
  v=${b##*/bench_sparse_mla_}
  [[ -x $b && $v != trace* ]] || continue
  timeout 60 "$b" "/tmp/mla_${v}_r2.json" quick >/dev/null 2>&1
  { echo "== variant $v, round 2"; python3 scripts/gpu/h_s32/summary.py "/tmp/mla_${v}_r2.json" | sed -n 2,6p; } >>"$out/table.txt" 2>&1
done
sed -n '/round 2/,$p' "$out/table.txt" | grep -v "^split\|^  B=" | tail -60
