#!/usr/bin/env bash
# h-moe7 (session 7): one device call for the MoE prefill path (expert_gemm_pf_kernel) and the
# router-logits kernels (its run of commit e73901c: results_20261201/). Runs the carried binaries (built locally for sm_90a, copied with
# this script to build/h7-moe-carry/ of the device tree): test_moe_cuda, bench_moe (moe.json),
# then compute-sanitizer memcheck over tiny cases that take the new kernels. Logs go to OUT_DIR
# (default $OUT); the summary is printed last.
#   build/h7-moe-carry/run.sh [OUT_DIR]      env: FILTER (gtest filter), T_TEST, T_BENCH, T_MEMCHECK
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-${OUT:-/tmp/h_moe7_out}}"
mkdir -p "$out"
bt="$here/test_moe_cuda"
bb="$here/bench_moe"
export DS_COMMIT="${DS_COMMIT:-$(cat "$here/commit.txt" 2>/dev/null || echo unknown)}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv >"$out/gpu.txt" 2>&1
t0=$(date +%s)
timeout "${T_TEST:-130}" "$bt" ${FILTER:+--gtest_filter=$FILTER} >"$out/test_moe_cuda.log" 2>&1
rc_t=$?
t1=$(date +%s)
timeout "${T_BENCH:-100}" "$bb" "$out/moe.json" >"$out/bench_moe.log" 2>&1
rc_b=$?
t2=$(date +%s)
rc_s=skipped
if command -v compute-sanitizer >/dev/null && [ "${T_MEMCHECK:-40}" -gt 0 ]; then
  timeout "${T_MEMCHECK:-40}" compute-sanitizer --tool memcheck --error-exitcode 1 "$bt" \
    --gtest_filter='MoeCuda.TinyUniformMxfp4:MoeCuda.TinySkewed:MoeCuda.RouterGateFormats' \
    >"$out/memcheck.log" 2>&1
  rc_s=$?
fi
t3=$(date +%s)
echo "==== test_moe_cuda (errors / max rel per case group)"
grep -E "Failure|Expected|Which is|worst|error:" "$out/test_moe_cuda.log" | head -30
grep -E "\] T=" "$out/test_moe_cuda.log" | sed -E 's/ oracle=.*\(/ (/; s/ mean_err.*//' | sort | \
  awk '{k=$0; sub(/ T=.*/, "", k); if (!(k in n)) order[++m]=k; n[k]++; last[k]=$0} END {for (i=1;i<=m;i++) print n[order[i]] "x " last[order[i]]}' | head -40
echo "==== bench_moe"
grep -vE "^route" "$out/bench_moe.log" | sed 's/ distinct=[0-9]* //; s/  */ /g' | cut -c1-170 | tail -60
grep -E "^route|ceilings" "$out/bench_moe.log"
echo "==== memcheck"; grep -E "ERROR SUMMARY|Invalid" "$out/memcheck.log" 2>/dev/null | head -5
echo "==== summary"
grep -E "^\[ +(OK|FAILED|PASSED) " "$out/test_moe_cuda.log" | tail -22
echo "test rc=$rc_t ($((t1 - t0))s) bench rc=$rc_b ($((t2 - t1))s) memcheck rc=$rc_s ($((t3 - t2))s) commit=$DS_COMMIT"
