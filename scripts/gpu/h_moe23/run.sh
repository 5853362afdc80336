#!/usr/bin/env bash
# Session 23: one device call for the wgmma prefill kernel's copy / descriptor / width changes.
# Runs scripts/gpu/h_moe18/run.sh on the carried binaries (BINS: test_moe_cuda, bench_moe,
# test_cuda_ops of the change, plus bench_moe_old / bench_moe_prev of other commits), then the
# GEMM rows of AB_CASES from the benches, interleaved AB_ROUNDS times (same GPU, same run), then the
# K loops of the default wgmma kernels in the SASS (sass_loops.py: length, spills, copies).
#   scripts/gpu/h_moe23/run.sh [OUT_DIR]    env: as h_moe18/run.sh, AB_CASES, AB_ROUNDS (2),
#   AB_FIRST=1 (the A/B before the tests)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe23_out}}"
mkdir -p "$out"
export BINS="${BINS:?packed binaries}" SKIP_SASS=1
c=/tmp/c18
ab() {
  local cases="${AB_CASES:-mxfp4:4096:0:0;mxfp4:8192:0:0;nvfp4:4096:0:0}"
  [ -x "$c/bench_moe_old" ] || [ -x "$c/bench_moe_prev" ] || return 0
  for i in $(seq "${AB_ROUNDS:-2}"); do
    for b in bench_moe_old bench_moe_prev bench_moe; do
      [ -x "$c/$b" ] || continue
      echo "== $b round $i"
      LD_LIBRARY_PATH="$c/lib" DS_MOE_CASES="$cases" timeout 120 "$c/$b" "/tmp/ab_$b.json" 2>&1 |
        grep -E "moe_gemms"
    done
  done
}
if [ "${AB_FIRST:-0}" = 1 ]; then  # the A/B before the tests (a call that may run out of time)
  rm -rf "$c" && mkdir -p "$c" && xz -dc "$BINS" | tar -C "$c" -xf - && ab
fi
bash scripts/gpu/h_moe18/run.sh "$out"
rc=$?
[ "${AB_FIRST:-0}" = 1 ] || ab
cuobj="$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)"
if [ -n "$cuobj" ]; then
  "$cuobj" -sass "$c/bench_moe" >/tmp/bench_moe.sass 2>/dev/null
  for k in 'expert_gemm_wg_kernelILb1ELi1ELi4E' 'expert_gemm_wg_kernelILb0ELi1ELi4E'; do
    python3 scripts/gpu/h_moe23/sass_loops.py "$k" </tmp/bench_moe.sass |
      tee -a "$out/sass_loops.txt" | head -40
  done
fi
rm -f "$out/gpu.txt"
exit $rc
