#!/usr/bin/env bash
# h-mla6: local preparation for scripts/gpu/h_mla6/run.sh (no GPU needed). Builds the test and the
# benchmark for sm_90a in build/h-mla6, links bench_sparse_mla_v3 (the v3 kernel) and, when
# VARIANT=lb2, bench_sparse_mla_lb2: the tree's kernel with two CTAs per SM at 32 heads
# (NOTES.md, next step 0), then copies the binaries to build/h-mla6-carry for `run` to carry.
set -euo pipefail
cd "$(dirname "$0")/../../.."
b=build/h-mla6
export CCACHE_BASEDIR="$PWD" CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
[ -f $b/build.ninja ] || cmake -S . -B $b -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build $b -j2 --target test_sparse_mla_cuda bench_sparse_mla
scripts/gpu/h_mla6/build_v3_bench.sh $b
mkdir -p build/h-mla6-carry
cp $b/tests/kernels/test_sparse_mla_cuda $b/bench/bench_sparse_mla $b/bench/bench_sparse_mla_v3 \
  build/h-mla6-carry/
rm -f build/h-mla6-carry/bench_sparse_mla_lb2
if [ "${VARIANT:-}" = lb2 ]; then
  v=$PWD/$b/sparse_mla_decode_lb2.cu
  sed 's/__launch_bounds__(Config<kD, kMT>::kThreads, kMT == 1 ? 2 : 1)/__launch_bounds__(Config<kD, kMT>::kThreads, kMT <= 2 ? 2 : 1)/' \
    src/kernels/cuda/attention/sparse_mla_decode.cu >"$v"
  grep -q "kMT <= 2 ? 2 : 1" "$v" || { echo "lb2: launch bounds line not found"; exit 1; }
  scripts/gpu/h_mla6/build_v3_bench.sh $b "$v" lb2
  cp $b/bench/bench_sparse_mla_lb2 build/h-mla6-carry/
fi
ls -la build/h-mla6-carry
