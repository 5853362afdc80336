#!/usr/bin/env bash
# h-idx6 (issue 7, session 6): one device call. Builds only test_indexer_cuda + bench_indexer
# (kernels-only, sm_90a), runs the test, then the benchmark; logs + JSON to $OUT.
#   scripts/gpu/h_idx6/run.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_idx6_out}}"
mkdir -p "$out"
export DS_COMMIT="${DS_COMMIT:-h-idx6-wip}"
b=build/h-idx6-dev
t0=$(date +%s)
cmake -S . -B "$b" -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$b" -j16 --target test_indexer_cuda bench_indexer >"$out/build.log" 2>&1 ||
  { grep -m 30 -E "error" "$out/build.log"; tail -20 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 ))s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -2
test_exe=$(find "$b/tests" -name test_indexer_cuda -type f | head -1)
bench_exe=$(find "$b/bench" -name bench_indexer -type f | head -1)
rc=0
t1=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 80 "$test_exe" >"$out/test_indexer_cuda.log" 2>&1 || rc=1
echo "test: $(( $(date +%s) - t1 ))s rc=$rc"
grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) " "$out/test_indexer_cuda.log" | head -30
[ $rc -eq 0 ] || grep -B2 -A6 -m 12 "Failure" "$out/test_indexer_cuda.log" | head -60
t2=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout 95 "$bench_exe" "$out/indexer.json" >"$out/bench_indexer.log" 2>&1 ||
  rc=$((rc + 2))
echo "bench: $(( $(date +%s) - t2 ))s rc=$rc"
grep -E "graph|ceiling" "$out/bench_indexer.log" | cut -c1-150 | tail -50
exit $rc
