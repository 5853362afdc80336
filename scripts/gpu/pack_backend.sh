#!/usr/bin/env bash
# Builds the CUDA backend's binaries on the dev machine (sm_90a only, the full build with the
# Debian -dev packages) and packs them, stripped, with the shared libraries the GPU machine lacks
# into build/carry/backend.tar.xz for scripts/gpu/run_backend.sh (pass build/carry as the `run`
# tool's carry; compressed because the working tree and the carry share a 64 MiB limit and the
# deepserve binary holds the embedded model's 16 MB of weights).
#
#   scripts/gpu/pack_backend.sh [BUILD_DIR]   (default build/cuda90)
set -euo pipefail
cd "$(dirname "$0")/../.."
bdir="${1:-build/cuda90}"
if [ ! -f "$bdir/build.ninja" ]; then
  cmake -S . -B "$bdir" -G Ninja -DDEEPSERVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
bins="test_cuda_ops test_elementwise_cuda test_gemm_cuda bench_gemm_fp8 test_cuda_sharded test_moe_cuda
      test_indexer_cuda test_ops_cuda bench_ops test_sparse_mla_cuda bench_sparse_mla
      test_kernels_cuda"
# shellcheck disable=SC2086
cmake --build "$bdir" -j"$(nproc)" --target deepserve $bins
rm -rf build/carry
mkdir -p build/carry/lib
cp "$bdir/bin/deepserve" build/carry/
for t in $bins; do
  cp "$(find "$bdir/tests" "$bdir/bench" -name "$t" -type f | head -1)" build/carry/
done
# shellcheck disable=SC2086
(cd build/carry && strip deepserve $bins)
# Shared libraries of Debian's -dev packages (the GPU machine has CUDA, glibc and libstdc++).
for lib in libfmt.so.9 libspdlog.so.1.10 libcpp-httplib.so.0.11 libbrotlidec.so.1 \
           libbrotlienc.so.1 libbrotlicommon.so.1; do
  cp -L "/usr/lib/x86_64-linux-gnu/$lib" build/carry/lib/
done
# shellcheck disable=SC2086
tar -C build/carry -cf - deepserve $bins lib |
  xz -T2 -9 > build/carry.tar.xz  # a 64 MiB dictionary: the binaries share their CUDA kernels
rm -rf build/carry
mkdir -p build/carry
mv build/carry.tar.xz build/carry/backend.tar.xz
# The tree the binaries were built from, for the results' provenance (DS_COMMIT; the GPU
# machine's copy of the tree has no .git).
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit+uncommitted"
echo "$commit" > build/carry/COMMIT
du -sh build/carry
