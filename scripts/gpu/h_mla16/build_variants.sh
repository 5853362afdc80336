#!/usr/bin/env bash
# Builds bench_sparse_mla (and test_sparse_mla_cuda) variants of the sm_90a kernels into
# build/carry/{bench_sparse_mla,test_sparse_mla_cuda}_abN, next to pack_backend.sh's tar.
# VARIANTS: 1..4 = -DDS_SPARSE_MLA_WG_ABLATE=N (timing only, results wrong); in eb475ca also
# 5 = the warp-specialized v8 kernel and 6 = PV in 128-dim wgmma (both removed since, NOTES.md v7).
# TESTS: variants whose test binary is built too.
set -euo pipefail
cd "$(dirname "$0")/../../.."
b=build/cuda90
bobj=$b/bench/CMakeFiles/bench_sparse_mla.dir/kernels/bench_sparse_mla.cu.o
tobj=$b/tests/kernels/CMakeFiles/test_sparse_mla_cuda.dir/test_sparse_mla_cuda.cu.o
libs="$b/src/kernels/cuda/libds_kernels_cuda.a $b/src/kernels/cpu/libds_kernels_cpu.a"
for v in ${VARIANTS:-1 2 3 4}; do
  case $v in
    *) flag="-DDS_SPARSE_MLA_WG_ABLATE=$v" ;;
  esac
  /usr/local/cuda/bin/nvcc -Isrc -Iinclude -O2 -DNDEBUG -lineinfo --expt-relaxed-constexpr \
    --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -std=c++20 \
    $flag -x cu -c src/kernels/cuda/attention/sparse_mla_decode.cu -o /tmp/smla_ab$v.o
  c++ -O2 $bobj /tmp/smla_ab$v.o -o build/carry/bench_sparse_mla_ab$v \
    -L/usr/local/cuda/targets/x86_64-linux/lib $b/bench/libds_bench_common.a $libs \
    /usr/local/cuda/lib/libcublas.so /usr/local/cuda/lib/libcudart_static.a -ldl -lrt \
    $b/src/core/libds_core.a -lgomp -lpthread /usr/local/cuda/lib/libcublasLt.so \
    /usr/local/cuda/lib/libculibos.a -Wl,-rpath,/usr/local/cuda/lib
  strip build/carry/bench_sparse_mla_ab$v
  if [[ " ${TESTS:-} " == *" $v "* ]]; then
    c++ -O2 $tobj /tmp/smla_ab$v.o -o build/carry/test_sparse_mla_cuda_ab$v \
      -L/usr/local/cuda/targets/x86_64-linux/lib $libs /usr/local/cuda/lib/libcudart_static.a \
      /usr/lib/x86_64-linux-gnu/libgtest_main.a -ldl -lrt $b/src/core/libds_core.a -lgomp \
      -lpthread /usr/lib/x86_64-linux-gnu/libgtest.a
    strip build/carry/test_sparse_mla_cuda_ab$v
  fi
done
