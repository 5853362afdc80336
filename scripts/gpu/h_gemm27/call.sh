#!/usr/bin/env bash
# Session 27: one device call for linear_fp8's kWgmma kernel (binaries carried, packed stripped
# with their libgomp: test_gemm_cuda, bench_gemm_fp8; nothing built on the device):
#   1. test_gemm_cuda's new tests (GEMM_FIRST, default the kWgmma tests and RejectsBadShapes);
#   2. compute-sanitizer memcheck of GEMM_SANITIZE (default WgmmaKernelConfigurations);
#   3. bench_gemm_fp8 batch mode (engine path, kAuto, kWgmma heuristic + layout sweep,
#      cuBLASLt, M = 1..64) -> OUT/gemm_batch.json, its tables -> OUT/bench_batch.txt;
#   4. PDL_OFF=1: the batch sweep without PDL (PDL_OFF_SHAPES, PDL_OFF_M) -> OUT/gemm_nopdl.json;
#   5. NCU="shape:m:wg,ks,stages,pipe;...": ncu sections of one kWgmma launch per entry;
#   6. the rest of test_gemm_cuda (SKIP_REST=1 skips it).
#   scripts/gpu/h_gemm27/call.sh [OUT_DIR]    env: BINS (xz tar), DS_COMMIT, BENCH_TIMEOUT (300)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_gemm27_out}}"
mkdir -p "$out"
c=/tmp/c27
. scripts/gpu/unpack_bins.sh && unpack_bins "${BINS:?packed binaries}" "$c"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv >"$out/gpu.txt"
first="${GEMM_FIRST:-*Wgmma*:*RejectsBadShapes*}"
timeout 240 "$c/test_gemm_cuda" --gtest_filter="$first" >"$out/test_first.log" 2>&1
echo "test_gemm_cuda [$first] rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_first.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure|got .* want' "$out/test_first.log" | head -20
grep -E '^wgmma ' "$out/test_first.log" | sort -k5 -g | tail -3
if [ "${SKIP_SANITIZE:-0}" != 1 ]; then
  timeout 150 compute-sanitizer --tool memcheck "$c/test_gemm_cuda" \
    --gtest_filter="*${GEMM_SANITIZE:-WgmmaKernelConfigurations}*" >"$out/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
fi
DS_COMMIT="${DS_COMMIT:-unknown}" timeout "${BENCH_TIMEOUT:-300}" "$c/bench_gemm_fp8" \
  "$out/gemm_batch.json" batch >"$out/bench_batch.txt" 2>&1
echo "bench rc=$?"
sed -n '/^ceilings/p;/^kWgmma/,$p' "$out/bench_batch.txt" | head -80
if [ "${PDL_OFF:-0}" = 1 ]; then  # the kWgmma sweep without PDL at the shapes / Ms given
  DS_BENCH_PDL=0 DS_BATCH_SHAPES="${PDL_OFF_SHAPES:-wq_b,wo_b}" DS_BATCH_M="${PDL_OFF_M:-16}" \
    DS_COMMIT="${DS_COMMIT:-unknown}" timeout 200 "$c/bench_gemm_fp8" "$out/gemm_nopdl.json" batch \
    >"$out/bench_nopdl.txt" 2>&1
  echo "bench (no PDL) rc=$?"
  sed -n '/^kWgmma/,/^$/p' "$out/bench_nopdl.txt" | head -20
fi
# NCU="shape:m:wg,ks,stages,pipe;...": ncu of the first kWgmma launch of each layout.
IFS=';' read -ra ncu_cases <<<"${NCU:-}"
for nc in "${ncu_cases[@]}"; do
  IFS=':' read -r sh mm cfg <<<"$nc"
  DS_WG_SWEEP=0 DS_BATCH_SHAPES="$sh" DS_BATCH_M="$mm" DS_WG_CFG="$cfg" timeout 240 \
    ncu --clock-control none -k regex:fp8_wgmma_kernel --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis "$c/bench_gemm_fp8" /tmp/ncu_dummy.json batch \
    >"$out/ncu_${sh}_${mm}_${cfg//,/_}.txt" 2>&1
  echo "ncu $nc rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issue Slots Busy|Eligible Warps|No Eligible|Registers Per|Block Limit|Waves Per SM|Cluster" \
    "$out/ncu_${sh}_${mm}_${cfg//,/_}.txt" | head -20
done
if [ "${SKIP_REST:-0}" != 1 ]; then
  timeout 240 "$c/test_gemm_cuda" --gtest_filter="-$first" >"$out/test_rest.log" 2>&1
  echo "test_gemm_cuda rest rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_rest.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/test_rest.log" | head
fi
if [ -x "$c/test_cuda_ops" ]; then  # the CUDA backend's whole-model tests (tiny model vs CPU)
  timeout 240 "$c/test_cuda_ops" >"$out/test_cuda_ops.log" 2>&1
  echo "test_cuda_ops rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_cuda_ops.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/test_cuda_ops.log" | head
fi
echo "== summary"
for f in test_first test_rest test_cuda_ops; do
  [ -f "$out/$f.log" ] && echo "$f: $(grep -E '^\[  (PASSED|FAILED) ' "$out/$f.log" | tr '\n' ' ')"
done
grep -hE '^wgmma ' "$out/test_first.log" 2>/dev/null | sort -k5 -g | tail -2
grep -E 'ERROR SUMMARY' "$out/memcheck.log" 2>/dev/null | tail -1
