#!/usr/bin/env bash
# Session 41: the binaries of scripts/gpu/h_s41/call.sh into build/carry (the tree's, then the
# sparse MLA variants bf16p = bf16 partials, bf16ps = bf16 partials + SPEC_INDEX, bf16p4 = bf16
# partials + the fast combine up to batch 4). Then, on
# the device (carry ["build/carry"]; ~6-8 minutes):
#   MOE_CASES='mxfp4:1:0:0;mxfp4:1:0:0:x;mxfp4:2:0:0;mxfp4:2:0:0:x;mxfp4:4:0:0;mxfp4:4:0:0:x;mxfp4:8:0:0;mxfp4:8:0:0:x;mxfp4:16:0:0;mxfp4:16:0:0:x;mxfp4:64:0:0;mxfp4:64:0:0:x;mxfp4:1:0:0:p;mxfp4:1:0:0:x:p;mxfp4:2:0:0:p;mxfp4:2:0:0:x:p' \
#     TESTS_OPS=1 MLA_FULL=1 MLA_FULL_VARIANTS=bf16p bash scripts/gpu/h_s41/call.sh $OUT
set -euo pipefail
cd "$(dirname "$0")/../../.."
bins="test_sparse_mla_cuda bench_sparse_mla test_moe_cuda bench_moe test_cuda_ops"
# shellcheck disable=SC2086
ninja -C build/full-cuda $bins
# shellcheck disable=SC2086
scripts/gpu/h_s29/pack.sh build/full-cuda $bins
scripts/gpu/h_s33/build_variant.sh bf16p "-DDS_SPARSE_MLA_BF16_PARTIALS=1" \
  test_sparse_mla_cuda bench_sparse_mla >/dev/null
scripts/gpu/h_s33/build_variant.sh bf16ps \
  "-DDS_SPARSE_MLA_BF16_PARTIALS=1 -DDS_SPARSE_MLA_SPEC_INDEX=1" \
  test_sparse_mla_cuda bench_sparse_mla >/dev/null
scripts/gpu/h_s33/build_variant.sh bf16p4 \
  "-DDS_SPARSE_MLA_BF16_PARTIALS=1 -DDS_SPARSE_MLA_COMBINE_FAST_MAX_PAIRS=256" \
  test_sparse_mla_cuda bench_sparse_mla >/dev/null
scripts/gpu/h_s34/pack_variants.sh >/dev/null
du -sb build/carry  # with the tree, under the 64 MiB that travel
