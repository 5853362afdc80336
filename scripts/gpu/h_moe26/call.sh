#!/usr/bin/env bash
# Session 26: one device call for the MoE kernels of this tree, all binaries carried (BINS, packed
# stripped: bench_moe, test_moe_cuda, test_gemm_cuda), nothing built on the device:
#   1. the same-binary A/B of the prefill GEMM rows in AB_CASES (default tiles against pf_step 8 /
#      32 and pf_sync 1), AB_ROUNDS times; the last run's JSON -> OUT/ab.json;
#   2. scripts/gpu/run_moe.sh: all of test_moe_cuda (the exhaustive division test included),
#      compute-sanitizer memcheck of MoeCuda.TinyWide*, the whole bench_moe -> OUT/moe.json;
#   3. test_gemm_cuda (linear_fp8's mbarrier helpers moved to a shared header in 5eb1a7c);
#   4. the K loops of the default wgmma kernels (cuobjdump + h_moe23/sass_loops.py).
#   scripts/gpu/h_moe26/call.sh [OUT_DIR]     env: BINS, AB_CASES, AB_ROUNDS (2), SKIP_FULL=1,
#   MOE_SANITIZE_FILTER (MoeCuda.TinyWide*), MOE_SANITIZE_TIMEOUT (90), SKIP_SASS=1,
#   MOE_SKIP_BENCH=1 (no whole bench_moe run)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe26_out}}"
mkdir -p "$out"
c=/tmp/c26
. scripts/gpu/unpack_bins.sh && unpack_bins "${BINS:?packed binaries}" "$c"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv >"$out/gpu.txt"
cases="${AB_CASES:-mxfp4:4096:0:0;mxfp4:4096:0:0:s8;mxfp4:4096:0:0:m;mxfp4:8192:0:0;mxfp4:8192:0:0:s8}"
for i in $(seq "${AB_ROUNDS:-2}"); do
  echo "== A/B round $i"
  DS_MOE_CASES="$cases" timeout 100 "$c/bench_moe" "$out/ab.json" 2>&1 |
    grep -E "moe_(gemms|forward)|^ceil" | awk '{print $1, $2, $(NF-6), $(NF-5), $(NF-4)}' | tee -a "$out/ab.txt"
done
rc=0
if [ "${SKIP_FULL:-0}" != 1 ]; then
  MOE_TEST_BIN="$c/test_moe_cuda" MOE_BENCH_BIN="$c/bench_moe" MOE_SANITIZE=1 \
    MOE_SANITIZE_FILTER="${MOE_SANITIZE_FILTER:-MoeCuda.TinyWide*}" MOE_TEST_TIMEOUT=240 \
    MOE_SANITIZE_TIMEOUT="${MOE_SANITIZE_TIMEOUT:-90}" MOE_BENCH_TIMEOUT=200 \
    MOE_SKIP_BENCH="${MOE_SKIP_BENCH:-0}" \
    bash scripts/gpu/run_moe.sh "$out" | tail -n 40
  rc=${PIPESTATUS[0]}
fi
rc_g=0
if [ -x "$c/test_gemm_cuda" ]; then
  timeout 150 "$c/test_gemm_cuda" >"$out/test_gemm_cuda.log" 2>&1
  rc_g=$?
  echo "test_gemm_cuda rc=$rc_g $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_gemm_cuda.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/test_gemm_cuda.log" | head
fi
cuobj="$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)"
if [ -n "$cuobj" ] && [ "${SKIP_SASS:-0}" != 1 ]; then
  timeout 90 "$cuobj" -sass "$c/bench_moe" >/tmp/bench_moe.sass 2>/dev/null
  for k in 'expert_gemm_wg_kernelILb1ELi1ELi4ELb0' 'expert_gemm_wg_kernelILb0ELi1ELi4ELb0'; do
    python3 scripts/gpu/h_moe23/sass_loops.py "$k" </tmp/bench_moe.sass >>"$out/sass_loops.txt"
  done
  grep -E "instructions|HGMMA" "$out/sass_loops.txt" | cut -c1-150 | head -24
fi
echo "run_moe rc=$rc  test_gemm_cuda rc=$rc_g"
[ "$rc" = 0 ] && [ "$rc_g" = 0 ]
