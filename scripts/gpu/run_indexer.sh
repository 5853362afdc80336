#!/usr/bin/env bash
# One GPU-machine call for the lightning indexer (issue 7): builds only test_indexer_cuda and
# bench_indexer with the kernels-only preset (sm_90a), runs the test, then the benchmark.
#   scripts/gpu/run_indexer.sh [OUT_DIR]   (default $OUT, else bench/results)
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-bench/results}}"
mkdir -p "$out"
export DS_COMMIT="${DS_COMMIT:-unknown+uncommitted}"
b=build/h-idx-dev
t0=$(date +%s)
cmake -S . -B "$b" -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$b" -j"$(nproc)" --target test_indexer_cuda bench_indexer >"$out/build.log" 2>&1 ||
  { grep -m 30 -E "error" "$out/build.log"; tail -20 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 ))s"
test_exe=$(find "$b/tests" -name test_indexer_cuda -type f | head -1)
bench_exe=$(find "$b/bench" -name bench_indexer -type f | head -1)
rc=0
timeout 150 "$test_exe" >"$out/test_indexer_cuda.log" 2>&1 || rc=1
grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) " "$out/test_indexer_cuda.log" | head -30
[ $rc -eq 0 ] || grep -B2 -A6 -m 12 "Failure" "$out/test_indexer_cuda.log" | head -80
timeout 90 "$bench_exe" "$out/indexer.json" >"$out/bench_indexer.log" 2>&1 || rc=$((rc + 2))
tail -45 "$out/bench_indexer.log"
exit $rc
