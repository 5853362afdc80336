#!/usr/bin/env bash
# h-idx7 experiment binary (built on the dev machine, after build/k): bench_indexer linked with an
# indexer.cu compiled with -DDS_INDEXER_SCORE_MIN_BLOCKS=2 (score kernel capped at 128 registers,
# 2 resident CTAs per SM). Output: build/k/bench/bench_indexer_mb2.
set -euo pipefail
cd "$(dirname "$0")/../../.."
b=build/k
v=$b/mb2
mkdir -p "$v"
nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] \
  --expt-relaxed-constexpr -lineinfo -std=c++20 -Isrc -Iinclude -DDS_INDEXER_SCORE_MIN_BLOCKS=2 \
  -c src/kernels/cuda/indexer/indexer.cu -o "$v/indexer.cu.o"
cp "$b/src/kernels/cuda/libds_kernels_cuda.a" "$v/libds_kernels_cuda.a"
(cd "$v" && ar d libds_kernels_cuda.a indexer.cu.o && ar q libds_kernels_cuda.a indexer.cu.o && ranlib libds_kernels_cuda.a)
c++ -O3 -DNDEBUG "$b/bench/CMakeFiles/bench_indexer.dir/kernels/bench_indexer.cu.o" \
  -o "$b/bench/bench_indexer_mb2" -L/usr/local/cuda/targets/x86_64-linux/lib \
  "$b/bench/libds_bench_common.a" "$v/libds_kernels_cuda.a" "$b/src/kernels/cpu/libds_kernels_cpu.a" \
  /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a \
  "$b/src/core/libds_core.a" /usr/lib/gcc/x86_64-linux-gnu/12/libgomp.so \
  /usr/lib/x86_64-linux-gnu/libpthread.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl
echo "built $b/bench/bench_indexer_mb2"
