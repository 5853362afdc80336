#!/usr/bin/env bash
# Session 26: the whole-model GPU tests (test_cuda_ops, carried with the shared libraries the GPU
# machine lacks: BINS, packed stripped) after the MoE change of the session (the shared expert on
# a side stream, CudaOpsOptions::moe_shared_stream: MoeSharedStreamGivesTheSerialLogits).
#   scripts/gpu/h_moe26/engine.sh [OUT_DIR]     env: BINS, OPS_FILTER (all)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe26_engine}}"
mkdir -p "$out"
c=/tmp/c26e
. scripts/gpu/unpack_bins.sh && unpack_bins "${BINS:?packed binaries}" "$c"
nvidia-smi --query-gpu=name,driver_version --format=csv >>"$out/gpu.txt"
timeout "${OPS_TIMEOUT:-300}" "$c/test_cuda_ops" ${OPS_FILTER:+--gtest_filter=$OPS_FILTER} \
  >"$out/test_cuda_ops.log" 2>&1
rc=$?
grep -E "^\[ +(OK|FAILED|PASSED) |Failure|Expected|Which is" "$out/test_cuda_ops.log" | head -40
echo "test_cuda_ops rc=$rc"
exit $rc
