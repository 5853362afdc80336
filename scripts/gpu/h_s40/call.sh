#!/usr/bin/env bash
# Session 40, one device call for issues 6 and 8 (binaries packed by scripts/gpu/h_s29/pack.sh
# into build/carry: test_sparse_mla_cuda bench_sparse_mla test_moe_cuda bench_moe test_cuda_ops):
#   1. TESTS (default test_sparse_mla_cuda test_moe_cuda test_cuda_ops; test_moe_cuda whole, or
#      MOE_FILTER);
#   2. bench_moe on MOE_CASES (both FP8 decode grids, one process) -> OUT/moe_persist.json;
#   3. the persistent MoE grid's tiny case under SANITIZERS (default racecheck synccheck memcheck);
#   4. MLA_FULL=1: bench_sparse_mla full run -> OUT/mla_full.json;
#   5. a table -> OUT/table.txt (printed last).
#   scripts/gpu/h_s40/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call.sh OUT}"
c=/tmp/carry_s40
mkdir -p "$out/logs"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
export DS_COMMIT="$(tr '\n' ' ' <build/carry/COMMIT)"
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
res() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; }
tab="$out/table.txt"
echo "gpu: $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader) commit $DS_COMMIT" >"$tab"
for t in ${TESTS-test_sparse_mla_cuda test_moe_cuda test_cuda_ops}; do
  f=""
  [ "$t" = test_moe_cuda ] && f="${MOE_FILTER:-}"
  timeout 150 "$c/$t" ${f:+--gtest_filter=$f} >"$out/logs/$t.log" 2>&1
  echo "$t rc=$? $(res "$out/logs/$t.log") $(el)" >>"$tab"
  grep -E '^\[  FAILED  \]|Failure' "$out/logs/$t.log" | head -20 >>"$tab"
done
if [ -n "${MOE_CASES:-}" ]; then
  DS_MOE_CASES="$MOE_CASES" timeout 150 "$c/bench_moe" "$out/moe_persist.json" \
    >"$out/logs/bench_moe.log" 2>&1
  echo "bench_moe rc=$? $(el)" >>"$tab"
  grep -E "^(mxfp4|nvfp4) |expert GEMMs|^ceil" "$out/logs/bench_moe.log" >>"$tab"
fi
for tool in ${SANITIZERS-racecheck synccheck memcheck}; do
  timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 9 "$c/test_moe_cuda" \
    --gtest_filter='MoeCuda.Fp8PersistentGridTiny' >"$out/logs/moe_$tool.log" 2>&1
  echo "$tool moe rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$out/logs/moe_$tool.log" | tr '\n' ' ') $(el)" >>"$tab"
done
if [ "${MLA_FULL:-0}" = 1 ]; then
  timeout 150 "$c/bench_sparse_mla" "$out/mla_full.json" >"$out/logs/bench_mla_full.log" 2>&1
  echo "bench_sparse_mla full rc=$? $(el)" >>"$tab"
  python3 scripts/gpu/h_s38/small.py "$out/mla_full.json" >>"$tab" 2>&1
fi
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
cat "$tab"
