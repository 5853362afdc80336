#!/usr/bin/env bash
# Session 35: the tree's binaries (build/full-cuda, sm_90a) and the v9 variants of the second call:
# the first tile before the second (first), the L2 evict-first KV copies (kvhint), both on the
# per-block barriers (first_blk1, first_blk2), session 34's blk1 / blk2 / pp again, and phase
# traces of first and kvhint; built two at a time, then xz-packed (scripts/gpu/h_s34/pack_variants.sh).
# Then, on the device: scripts/gpu/h_s35/call.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../../.."
ninja -C build/full-cuda test_sparse_mla_cuda bench_sparse_mla test_cuda_ops
scripts/gpu/h_s29/pack.sh build/full-cuda test_sparse_mla_cuda bench_sparse_mla test_cuda_ops
v() { scripts/gpu/h_s33/build_variant.sh "$@" >/dev/null 2>"/tmp/variant_$1.err" || echo "variant $1 FAILED"; }
F="-DDS_SPARSE_MLA_WS_FIRST=1"
{
  v first "$F"
  v first_blk2 "$F -DDS_SPARSE_MLA_WS_BLOCKBAR=2"
  v blk1 "-DDS_SPARSE_MLA_WS_BLOCKBAR=1" bench_sparse_mla
  v trace128first "-DDS_SPARSE_MLA_WS_TRACE=128 $F" bench_sparse_mla
  v trace16kvhint "-DDS_SPARSE_MLA_WS_TRACE=16 -DDS_SPARSE_MLA_WS_KVHINT=1" bench_sparse_mla
} &
{
  v kvhint "-DDS_SPARSE_MLA_WS_KVHINT=1"
  v first_blk1 "$F -DDS_SPARSE_MLA_WS_BLOCKBAR=1" bench_sparse_mla
  v blk2 "-DDS_SPARSE_MLA_WS_BLOCKBAR=2" bench_sparse_mla
  v pp "-DDS_SPARSE_MLA_WS_PINGPONG=1" bench_sparse_mla
  v trace16first "-DDS_SPARSE_MLA_WS_TRACE=16 $F" bench_sparse_mla
} &
wait
cat /tmp/variant_*.err | grep -v C7519 || true  # compiler messages other than the known C7519
scripts/gpu/h_s34/pack_variants.sh
du -sh build/carry
