#!/usr/bin/env bash
# h-idx8 experiment binaries (dev machine, after build/k is built): bench_indexer (and with
# --test also test_indexer_cuda) linked against an indexer.cu compiled with extra -D flags.
#   scripts/gpu/h_idx8/build_variant.sh NAME "-DFOO=1 -DBAR=2" [--test]
# Output: build/k/variants/NAME/{bench_indexer,test_indexer_cuda}.
set -euo pipefail
cd "$(dirname "$0")/../../.."
name=$1 flags=$2 with_test=${3:-}
b=build/k
v=$b/variants/$name
mkdir -p "$v"
# shellcheck disable=SC2086
nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] \
  --expt-relaxed-constexpr -lineinfo -std=c++20 -Isrc -Iinclude $flags \
  -c src/kernels/cuda/indexer/indexer.cu -o "$v/indexer.cu.o"
cp "$b/src/kernels/cuda/libds_kernels_cuda.a" "$v/libds_kernels_cuda.a"
(cd "$v" && ar d libds_kernels_cuda.a indexer.cu.o && ar q libds_kernels_cuda.a indexer.cu.o &&
  ranlib libds_kernels_cuda.a)
libs=("$v/libds_kernels_cuda.a" "$b/src/kernels/cpu/libds_kernels_cpu.a"
  /usr/local/cuda/lib/libcudart_static.a)
tail_libs=(-ldl /usr/lib/x86_64-linux-gnu/librt.a "$b/src/core/libds_core.a"
  /usr/lib/gcc/x86_64-linux-gnu/12/libgomp.so /usr/lib/x86_64-linux-gnu/libpthread.a)
c++ -O3 -DNDEBUG "$b/bench/CMakeFiles/bench_indexer.dir/kernels/bench_indexer.cu.o" \
  -o "$v/bench_indexer" -L/usr/local/cuda/targets/x86_64-linux/lib "$b/bench/libds_bench_common.a" \
  "${libs[@]}" "${tail_libs[@]}" -lcudadevrt -lcudart_static -lrt -lpthread -ldl
if [ "$with_test" = "--test" ]; then
  c++ -O3 -DNDEBUG "$b/tests/kernels/CMakeFiles/test_indexer_cuda.dir/test_indexer_cuda.cu.o" \
    -o "$v/test_indexer_cuda" -L/usr/local/cuda/targets/x86_64-linux/lib "${libs[@]}" \
    /usr/lib/x86_64-linux-gnu/libgtest_main.a "${tail_libs[@]}" /usr/lib/x86_64-linux-gnu/libgtest.a \
    -lcudadevrt -lcudart_static -lrt -lpthread -ldl
fi
echo "built $v"
