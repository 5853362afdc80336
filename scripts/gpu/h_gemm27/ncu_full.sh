#!/usr/bin/env bash
# Session 27: ncu --set full of one kWgmma launch per case, for the next design (what bounds the
# kernel at 64 tokens): the e4m3 wq_b layout (2 warpgroups, k_split 1, 4 stages) and the bf16-input
# wo_a one (2 warpgroups, k_split 2, 4 stages), picked by the mangled instance name.
# Binaries: BINS (xz tar with bench_gemm_fp8 and lib/).
#   scripts/gpu/h_gemm27/ncu_full.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: ncu_full.sh OUT}"
c=/tmp/c27n
. scripts/gpu/unpack_bins.sh && unpack_bins "${BINS:?packed binaries}" "$c"
run() {  # run NAME SHAPE M HF INSTANCE
  DS_WG_SWEEP=0 DS_BATCH_SHAPES="$2" DS_BATCH_M="$3" DS_BATCH_HF="$4" timeout 200 \
    ncu --clock-control none --set full --import-source no --kernel-name-base mangled \
    -k "regex:$5" --launch-count 1 "$c/bench_gemm_fp8" /tmp/ncu_dummy.json batch \
    >"$out/ncu_full_$1.txt" 2>&1
  echo "$1 rc=$?"
  grep -E "^    (Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Eligible Warps|No Eligible|Achieved Occupancy|Registers Per|Stall)" \
    "$out/ncu_full_$1.txt" | head -12
}
run wq_b_m64_e4m3 wq_b 64 0 fp8_wgmma_kernelILi64ELi2ELi4ELb0E
run wo_a_m64_bf16 wo_a 64 1 fp8_wgmma_kernelILi64ELi2ELi4ELb1E
