#!/usr/bin/env bash
# h-gemm12 call 3 (issue 5, session 12): after the ensure_max_dynamic_smem fix and the M <= 8
# restriction of the tile-ordered copy: the tiled and kBulk/kStream configuration tests three
# times, then every packed GPU test binary once (binaries of scripts/gpu/pack_backend.sh).
#   bash scripts/gpu/h_gemm12/check3.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: check3.sh OUT}"
mkdir -p "$out/logs"
c=/tmp/carry_g12
rm -rf "$c" && mkdir -p "$c"
xz -dc build/carry/backend.tar.xz | tar -C "$c" -xf - || { echo "no carry"; exit 2; }
export LD_LIBRARY_PATH="$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
timeout 150 "$c/test_gemm_cuda" --gtest_repeat=3 \
  --gtest_filter='*Tiled*:*TileOrder*:*BulkKernel*:*StreamKernelConfigurations*' \
  >"$out/logs/test_gemm_tiled_repeat.log" 2>&1
echo "gemm tiled x3: rc=$? $(grep -cE '^\[       OK' "$out/logs/test_gemm_tiled_repeat.log") ok, $(grep -cE '^\[  FAILED  \] Gemm.*ms\)' "$out/logs/test_gemm_tiled_repeat.log") failed"
grep -A6 "Failure" "$out/logs/test_gemm_tiled_repeat.log" | grep -E "cu:19[0-9]: |CUDA error|^token" | sort | uniq -c | head -12
for t in test_cuda_ops test_ops_cuda test_moe_cuda test_indexer_cuda test_sparse_mla_cuda \
         test_elementwise_cuda test_gemm_cuda test_kernels_cuda; do
  t0=$(date +%s)
  timeout 170 "$c/$t" >"$out/logs/$t.log" 2>&1
  rc=$?
  printf '%-24s rc=%-3s %4ss %s\n' "$t" "$rc" "$(( $(date +%s) - t0 ))" \
    "$(grep -E '^\[  (PASSED|FAILED) ' "$out/logs/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure" "$out/logs/$t.log" | head -6
done
grep -E "metric.*tiled" "$out/logs/test_cuda_ops.log"
tar -C "$out" -czf "$out/check3_logs.tgz" logs && rm -rf "$out/logs"
