#!/usr/bin/env bash
# h-gemm12 call 2 (issue 5, session 12): the tile-ordered kBulk tests repeated (the session's
# first call saw one failure in the tiled kBulk configuration sweep), then the merged check
# (every GPU test binary, bench_ops, Flash 4-layer profiles once per DEEPSERVE_TILED_FP8 value,
# serving) on the binaries of scripts/gpu/pack_backend.sh (carry build/carry and the tokenizer).
#   bash scripts/gpu/h_gemm12/check2.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: check2.sh OUT}"
mkdir -p "$out"
c=/tmp/carry_g12
rm -rf "$c" && mkdir -p "$c"
xz -dc build/carry/backend.tar.xz | tar -C "$c" -xf - || { echo "no carry"; exit 2; }
export LD_LIBRARY_PATH="$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
timeout 120 "$c/test_gemm_cuda" --gtest_repeat=3 \
  --gtest_filter='*Tiled*:*TileOrder*:*BulkKernelConfigurations*:*StreamKernelConfigurations*' \
  >"$out/test_gemm_tiled_repeat.log" 2>&1
echo "gemm tiled x3: rc=$? $(grep -cE '^\[       OK' "$out/test_gemm_tiled_repeat.log") ok, $(grep -cE '^\[  FAILED  \] Gemm' "$out/test_gemm_tiled_repeat.log") failed"
grep -B1 -A3 "Failure" "$out/test_gemm_tiled_repeat.log" | grep -E "trace|cu:1[89][0-9]: |cu:2[0-9][0-9]: " | sort | uniq -c | head -20
PROFILE_TILED="1 0" bash scripts/gpu/run_merged_check.sh "$out" 4
