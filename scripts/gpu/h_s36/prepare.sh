#!/usr/bin/env bash
# Next call after session 35 (issue 6): the tree's binaries (build/full-cuda, sm_90a; the tree has
# the evict-first KV copies) and the v9 variants to measure on it: blk2 (per-block barriers, made
# default if it keeps its -4.5% at B=64 here), backoff100 (the consumers' full wait sleeps 100 ns
# between polls: is the 6.3 us first conversion issue-slot starvation?), pp (the ping-pong
# consumers, -8.6% at B=16 in session 35), and phase traces with the conversion units of the first
# two tiles. Built two at a time, xz-packed. Then, on the device (~3-4 min):
#   SANITIZE_VARIANTS="blk2 backoff100" scripts/gpu/h_s35/call.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../../.."
ninja -C build/full-cuda test_sparse_mla_cuda bench_sparse_mla test_cuda_ops
scripts/gpu/h_s29/pack.sh build/full-cuda test_sparse_mla_cuda bench_sparse_mla test_cuda_ops
v() { scripts/gpu/h_s33/build_variant.sh "$@" >/dev/null 2>"/tmp/variant_$1.err" || echo "variant $1 FAILED"; }
B="-DDS_SPARSE_MLA_WS_BACKOFF=100"
{
  v blk2 "-DDS_SPARSE_MLA_WS_BLOCKBAR=2"
  v pp "-DDS_SPARSE_MLA_WS_PINGPONG=1" bench_sparse_mla
  v trace128 "-DDS_SPARSE_MLA_WS_TRACE=128" bench_sparse_mla
  v trace16 "-DDS_SPARSE_MLA_WS_TRACE=16" bench_sparse_mla
} &
{
  v backoff100 "$B"
  v trace128backoff100 "-DDS_SPARSE_MLA_WS_TRACE=128 $B" bench_sparse_mla
  v trace16backoff100 "-DDS_SPARSE_MLA_WS_TRACE=16 $B" bench_sparse_mla
  v trace128blk2 "-DDS_SPARSE_MLA_WS_TRACE=128 -DDS_SPARSE_MLA_WS_BLOCKBAR=2" bench_sparse_mla
} &
wait
cat /tmp/variant_*.err | grep -v C7519 || true  # compiler messages other than the known C7519
scripts/gpu/h_s34/pack_variants.sh
du -sh build/carry
