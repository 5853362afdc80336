#!/usr/bin/env bash
# Session 32: bench_sparse_mla variants of v9 (timing only, results wrong) into
# build/carry/bench_sparse_mla_wsN, linked against build/full-cuda's objects with
# sparse_mla_decode.cu rebuilt with -DDS_SPARSE_MLA_WS_ABLATE=N (1 no conversion, 2 no consumer
# math, 3 no copies; 4, no L2 prefetch, until session 33 removed the prefetch). Run after
# pack.sh (which recreates build/carry).
#   VARIANTS="1 2 3" scripts/gpu/h_s32/build_ablations.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
b=build/full-cuda
obj=src/kernels/cuda/CMakeFiles/ds_kernels_cuda.dir/attention/sparse_mla_decode.cu.o
cc=$(ninja -C $b -t commands $obj | tail -1)
link=$(ninja -C $b -t commands bench/bench_sparse_mla | tail -1)
for v in ${VARIANTS:-1 2 3}; do
  (cd $b && eval "${cc/-o $obj/-DDS_SPARSE_MLA_WS_ABLATE=$v -o /tmp/smla_ws$v.o}")
  l=${link/-o bench\/bench_sparse_mla/-o /tmp/bench_sparse_mla_ws$v /tmp/smla_ws$v.o}
  (cd $b && eval "$l")
  strip /tmp/bench_sparse_mla_ws$v
  cp /tmp/bench_sparse_mla_ws$v build/carry/
done
ls -la build/carry
