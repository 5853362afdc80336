#!/usr/bin/env bash
# Session 32, device call 3 (issue 6): v9's ablations. test_sparse_mla_cuda, then
# bench_sparse_mla quick (v7 and v9 side by side) and the timing-only variants
# build/carry/bench_sparse_mla_ws{1..4} (scripts/gpu/h_s32/build_ablations.sh: 1 no conversion,
# 2 no consumer math, 3 no copies, 4 no L2 prefetch), each -> OUT/mla_wsN.json; summary.py tables.
#   scripts/gpu/h_s32/call2.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call2.sh OUT}"
c=/tmp/carry_s32
mkdir -p "$out/logs"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
export DS_COMMIT="$(cat build/carry/COMMIT)"
s=("gpu: $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader) commit $DS_COMMIT")
timeout 120 "$c/test_sparse_mla_cuda" >"$out/logs/test.log" 2>&1
s+=("test_sparse_mla_cuda rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/logs/test.log" | tr '\n' ' ')")
for v in 0 1 2 3 4; do
  b="$c/bench_sparse_mla"
  [ "$v" = 0 ] || b="build/carry/bench_sparse_mla_ws$v"
  timeout 90 "$b" "$out/mla_ws$v.json" quick >"$out/logs/bench_ws$v.log" 2>&1
  s+=("bench ws$v rc=$?")
  { echo "== ablation $v"; python3 scripts/gpu/h_s32/summary.py "$out/mla_ws$v.json"; } >>"$out/table.txt" 2>&1
done
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
cat "$out/table.txt"
printf '%s\n' "${s[@]}"
