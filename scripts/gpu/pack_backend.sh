#!/usr/bin/env bash
# Builds the CUDA backend's binaries on the dev machine (sm_90a only, the full build with the
# Debian -dev packages) and packs them, stripped, with the shared libraries the GPU machine lacks
# into build/carry for scripts/gpu/run_backend.sh (pass build/carry as the `run` tool's carry).
#
#   scripts/gpu/pack_backend.sh [BUILD_DIR]   (default build/cuda90)
set -euo pipefail
cd "$(dirname "$0")/../.."
bdir="${1:-build/cuda90}"
if [ ! -f "$bdir/build.ninja" ]; then
  cmake -S . -B "$bdir" -G Ninja -DDEEPSERVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$bdir" -j"$(nproc)" --target deepserve test_cuda_ops test_elementwise_cuda
rm -rf build/carry
mkdir -p build/carry/lib
cp "$bdir/bin/deepserve" build/carry/
for t in test_cuda_ops test_elementwise_cuda; do
  cp "$(find "$bdir/tests" -name "$t" -type f | head -1)" build/carry/
done
strip build/carry/deepserve build/carry/test_cuda_ops build/carry/test_elementwise_cuda
# Shared libraries of Debian's -dev packages (the GPU machine has CUDA, glibc and libstdc++).
for lib in libfmt.so.9 libspdlog.so.1.10 libcpp-httplib.so.0.11 libbrotlidec.so.1 \
           libbrotlienc.so.1 libbrotlicommon.so.1; do
  cp -L "/usr/lib/x86_64-linux-gnu/$lib" build/carry/lib/
done
du -sh build/carry
