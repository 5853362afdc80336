#!/usr/bin/env bash
# Session 29: ncu --set full (clocks untouched, PC sampling every cycle) of the first gate/up and
# down launches of the FP8 decode GEMMs in bench_moe's default MXFP4 forward at T = NCU_T (1):
# the details page (occupancy, eligible warps, DRAM throughput, stall reasons) and the SASS lines
# with the most stall samples (scripts/gpu/ncu_top_sass.py). Binaries: build/carry/backend.tar.xz.
#   scripts/gpu/h_s29/ncu_t1.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: ncu_t1.sh OUT}"
c=/tmp/carry_s29n
mkdir -p "$out"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
T="${NCU_T:-1}"
DS_MOE_CASES="mxfp4:$T:0:0" timeout 300 ncu --clock-control none --set full --import-source yes \
  --warp-sampling-interval 0 \
  --kernel-name regex:expert_gemm_f8 --launch-count 2 -f -o "$out/f8_T$T" \
  "$c/bench_moe" /tmp/ncu_bench.json >"$out/ncu_run.log" 2>&1
echo "ncu rc=$?"
scripts/gpu/ncu_summary.sh "$out/f8_T$T.ncu-rep" "$out" 20
