#!/usr/bin/env bash
# h-mla7 (session 7, v5): local preparation for run.sh (no GPU needed). Builds the sparse-MLA test
# and benchmark for sm_90a (Release) in build/k of this worktree, links two more benchmark
# binaries from the same bench object (scripts/gpu/h_mla6/build_v3_bench.sh):
#   bench_sparse_mla_v4    the v4 kernel (commit 97ff9d2), timed in the same call
#   bench_sparse_mla_nopdl v5 with the combine launched in plain stream order
#   bench_sparse_mla_p2gf, test_sparse_mla_cuda_p2gf  (P2=1) two tiles per step at 16 heads
# strips them and copies them with run.sh to CARRY (default /work/main/build/h8-mla-carry), the
# folder the `run` tool carries.
set -euo pipefail
cd "$(dirname "$0")/../../.."
root=$PWD
b=build/k
carry=${CARRY:-/work/main/build/h8-mla-carry}
[ -f $b/build.ninja ] || cmake -S . -B $b -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release
cmake --build $b -j2 --target test_sparse_mla_cuda bench_sparse_mla
git show 97ff9d2:src/kernels/cuda/attention/sparse_mla_decode.cu >$b/sparse_mla_decode_v4.cu
scripts/gpu/h_mla6/build_v3_bench.sh $b $b/sparse_mla_decode_v4.cu v4
printf '#define DS_SPARSE_MLA_COMBINE_PDL 0\n#include "%s/src/kernels/cuda/attention/sparse_mla_decode.cu"\n' \
  "$root" >$b/sparse_mla_decode_nopdl.cu
scripts/gpu/h_mla6/build_v3_bench.sh $b $b/sparse_mla_decode_nopdl.cu nopdl
# P2=1: the tree's kernel with the plan picking two tiles per step at 16 heads, as its own test
# and benchmark binaries (*_p2gf; call 2 ran the same loop from 9c7e537 this way).
p2=""
if [ "${P2:-0}" = 1 ]; then
  scripts/gpu/h_mla7/build_variant.sh $b "$root/src/kernels/cuda/attention/sparse_mla_decode.cu" p2gf \
    -DDS_SPARSE_MLA_TILES_PER_STEP16=2
  p2="$b/bench/bench_sparse_mla_p2gf $b/tests/kernels/test_sparse_mla_cuda_p2gf"
fi
mkdir -p "$carry"
rm -f "$carry"/*
for f in $b/tests/kernels/test_sparse_mla_cuda $b/bench/bench_sparse_mla $b/bench/bench_sparse_mla_v4 \
  $b/bench/bench_sparse_mla_nopdl $p2; do
  cp "$f" "$carry"/ && strip "$carry/$(basename "$f")"
done
cp scripts/gpu/h_mla7/run.sh "$carry"/
ls -la "$carry"; du -sh "$carry"
