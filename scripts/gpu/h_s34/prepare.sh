#!/usr/bin/env bash
# Session 34: everything the next device call carries, from build/full-cuda (sm_90a): the tree's
# binaries (pack.sh), the v9 variants' tests and benches (pipe, blk1, blk2, pp) and the phase-trace
# benches, the variants xz-packed. Then, on the device:
#   SANITIZE_VARIANTS="pp blk1" bash scripts/gpu/h_s34/call.sh OUT   (everything, ~4-5 min), or
#   LEAN_TESTS="pp blk1 blk2 pipe" LEAN_BENCHES="_pp _blk1 _blk2 _pipe" bash scripts/gpu/h_s34/lean.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../../.."
ninja -C build/full-cuda test_sparse_mla_cuda bench_sparse_mla test_cuda_ops
scripts/gpu/h_s29/pack.sh build/full-cuda test_sparse_mla_cuda bench_sparse_mla test_cuda_ops
v() { scripts/gpu/h_s33/build_variant.sh "$@" >/dev/null; }
v pp "-DDS_SPARSE_MLA_WS_PINGPONG=1"
v blk1 "-DDS_SPARSE_MLA_WS_BLOCKBAR=1"
v blk2 "-DDS_SPARSE_MLA_WS_BLOCKBAR=2"
v pipe "-DDS_SPARSE_MLA_WS_PIPE=1"
for n in 128 16; do
  v "trace$n" "-DDS_SPARSE_MLA_WS_TRACE=$n" bench_sparse_mla
  v "trace${n}blk1" "-DDS_SPARSE_MLA_WS_TRACE=$n -DDS_SPARSE_MLA_WS_BLOCKBAR=1" bench_sparse_mla
done
v trace128pipe "-DDS_SPARSE_MLA_WS_TRACE=128 -DDS_SPARSE_MLA_WS_PIPE=1" bench_sparse_mla
scripts/gpu/h_s34/pack_variants.sh
du -sh build/carry
