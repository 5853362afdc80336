#!/usr/bin/env bash
# h-mla6 (session 6): one device call for the sparse MLA decode v4 change. Uses the carried
# binaries (build/h-mla6-carry, built locally for sm_90a: test_sparse_mla_cuda, bench_sparse_mla
# = v4, bench_sparse_mla_v3 = the committed v3 kernel) or builds them with the kernels-only
# configuration. Runs the test, the v3 benchmark (quick: B=1 and B=128 at 32K), the v4 benchmark
# (full), racecheck over small cases, then the full v3 (or lb2 variant) benchmark if time is left.
#   scripts/gpu/h_mla6/run.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_mla6_out}}"
mkdir -p "$out"
start=$(date +%s)
left() { echo $((${BUDGET:-285} - ($(date +%s) - start))); }
c=build/h-mla6-carry
bt=$c/test_sparse_mla_cuda
bb=$c/bench_sparse_mla
b3=$c/bench_sparse_mla_v3
if ! [ -x "$bt" ] || ! "$bt" --gtest_list_tests >/dev/null 2>&1 || ! [ -x "$b3" ]; then
  echo "building"
  b=build/h-mla6-dev
  cmake -S . -B $b -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$out/build.log" 2>&1
  cmake --build $b -j"$(nproc)" --target test_sparse_mla_cuda bench_sparse_mla >>"$out/build.log" 2>&1 ||
    { grep -m 20 -E "error" "$out/build.log"; exit 1; }
  scripts/gpu/h_mla6/build_v3_bench.sh $b >>"$out/build.log" 2>&1 || echo "v3 bench build failed"
  bt=$b/tests/kernels/test_sparse_mla_cuda
  bb=$b/bench/bench_sparse_mla
  b3=$b/bench/bench_sparse_mla_v3
  echo "built in $(( $(date +%s) - start ))s"
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader | head -1
t0=$(date +%s)
timeout 100 "$bt" >"$out/test.log" 2>&1
rc_t=$?
echo "test rc=$rc_t ($(( $(date +%s) - t0 ))s)"
grep -E "^\[ +(OK|FAILED|PASSED) |Failure|Expected|Which is|splits" "$out/test.log" | head -30
t0=$(date +%s)
timeout 40 "$b3" /tmp/h_mla6_v3_quick.json quick >"$out/bench_v3_quick.log" 2>&1
echo "v3 quick rc=$? ($(( $(date +%s) - t0 ))s)"
t0=$(date +%s)
timeout $(( $(left) > 120 ? 120 : $(left) - 5 )) "$bb" "$out/sparse_mla_decode.json" >"$out/bench_v4.log" 2>&1
echo "v4 bench rc=$? ($(( $(date +%s) - t0 ))s)"
if command -v compute-sanitizer >/dev/null && [ "$(left)" -gt 60 ]; then
  t0=$(date +%s)
  timeout 35 compute-sanitizer --tool racecheck --error-exitcode 1 "$bt" \
    --gtest_filter='SparseMlaCuda.TinyShapes:SparseMlaCuda.FlashShortLengthsAndMasks' \
    >"$out/racecheck.log" 2>&1
  echo "racecheck rc=$? ($(( $(date +%s) - t0 ))s)"
  grep -E "RACECHECK SUMMARY|hazard|Error" "$out/racecheck.log" | head -5
fi
# The last benchmark: the lb2 variant when prepared (scripts/gpu/h_mla6/prepare.sh with
# VARIANT=lb2), else the full v3 benchmark (at most 8 files come back).
last=$b3; tag=v3
[ -x $c/bench_sparse_mla_lb2 ] && { last=$c/bench_sparse_mla_lb2; tag=lb2; }
if [ "$(left)" -gt 50 ]; then
  t0=$(date +%s)
  timeout $(( $(left) - 5 )) "$last" "$out/sparse_mla_decode_$tag.json" >"$out/bench_$tag.log" 2>&1
  echo "$tag full bench rc=$? ($(( $(date +%s) - t0 ))s)"
fi
echo "=== v3 quick"; grep -E "^sparse_mla_decode " "$out/bench_v3_quick.log"
echo "=== v4"; grep -E "^(sparse_mla|ceiling)|copy ceiling" "$out/bench_v4.log"
echo "=== $tag full"; grep -E "^sparse_mla_decode|^sparse_mla_decode_alt .*B=128" "$out/bench_$tag.log" 2>/dev/null
echo "total $(( $(date +%s) - start ))s"
