#!/usr/bin/env bash
# Session 22: one device call for the wgmma prefill kernel's dequantization changes.
# Runs scripts/gpu/h_moe18/run.sh on the carried binaries (BINS, default build/c28/bins.tar.xz:
# test_moe_cuda, bench_moe, test_cuda_ops of the change, plus bench_moe_prev / bench_moe_old of
# earlier commits for an A/B in the same run), then the earlier benches on AB_CASES (GEMM rows to
# stdout), then (NCU=1) the SASS of the profiled kernels with their stall samples (sass_dump.py:
# the sampled instructions) as $OUT/sass_<case>.txt.gz. Files kept under OUT: at most 8 (the run
# tool's limit).
#   scripts/gpu/h_moe22/run.sh [OUT_DIR]    env: as h_moe18/run.sh, AB_CASES
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe22_out}}"
mkdir -p "$out"
export BINS="${BINS:-build/c28/bins.tar.xz}"
bash scripts/gpu/h_moe18/run.sh "$out"
rc=$?
c=/tmp/c18
for b in bench_moe_prev bench_moe_old; do
  [ -x "$c/$b" ] || continue
  echo "== $b"
  LD_LIBRARY_PATH="$c/lib" DS_MOE_CASES="${AB_CASES:-mxfp4:1024:0:0;mxfp4:4096:0:0;mxfp4:8192:0:0;nvfp4:4096:0:0}" \
    timeout 120 "$c/$b" "/tmp/$b.json" 2>&1 | grep -E "ceilings|moe_gemms"
done
if [ "${NCU:-0}" = 1 ]; then
  for f in /tmp/ncu_*.csv; do
    [ -f "$f" ] || continue
    t="$(basename "$f" .csv)"
    python3 scripts/gpu/h_moe22/sass_dump.py "$f" | gzip -9 >"$out/sass_${t#ncu_}.txt.gz"
  done
fi
rm -f "$out/gpu.txt"
exit $rc
