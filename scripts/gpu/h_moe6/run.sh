#!/usr/bin/env bash
# h-moe6 (session 6): one device call for the MoE decode work (column blocks per CTA, rings,
# programmatic dependent launch). Uses the carried binaries (build/h-moe6, built locally for
# sm_90a; build/h-moe6-old/bench_moe_old = bench_moe of the code before this session's changes)
# or builds them with the kernels-only configuration; runs test_moe_cuda, the new bench_moe
# (moe.json) and the old one (log only); logs go to OUT_DIR.
#   scripts/gpu/h_moe6/run.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe6_out}}"
mkdir -p "$out"
bt=build/h-moe6/tests/kernels/test_moe_cuda
bb=build/h-moe6/bench/bench_moe
bo=build/h-moe6-old/bench_moe_old
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if ! [ -x "$bt" ] || ! [ -x "$bb" ] || ! "$bt" --gtest_list_tests >/dev/null 2>&1; then
  echo "building"
  b=build/h-moe6-dev
  cmake -S . -B $b -G Ninja -DDEEPSERVE_CUDA=ON -DDEEPSERVE_KERNELS_ONLY=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$out/configure.log" 2>&1
  cmake --build $b -j16 --target test_moe_cuda bench_moe >"$out/build.log" 2>&1 ||
    { grep -m 20 -E "error" "$out/build.log"; exit 1; }
  bt=$b/tests/kernels/test_moe_cuda
  bb=$b/bench/bench_moe
fi
t0=$(date +%s)
timeout "${T_TEST:-100}" "$bt" ${FILTER:+--gtest_filter=$FILTER} >"$out/test_moe_cuda.log" 2>&1
rc_t=$?
t1=$(date +%s)
grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure|Expected|Which is|worst" "$out/test_moe_cuda.log" | head -30
echo "test rc=$rc_t ($((t1 - t0))s)"
sb=""; command -v stdbuf >/dev/null && sb="stdbuf -oL"
timeout "${T_BENCH:-110}" $sb "$bb" "$out/moe.json" >"$out/bench_moe.log" 2>&1
rc_b=$?
t2=$(date +%s)
echo "bench rc=$rc_b ($((t2 - t1))s)"
rc_o=skipped
if [ -x "$bo" ]; then
  timeout "${T_OLD:-40}" $sb "$bo" "$out/moe_old.json" >"$out/bench_moe_old.log" 2>&1
  rc_o=$?
fi
t3=$(date +%s)
echo "old bench rc=$rc_o ($((t3 - t2))s)"
short() { sed 's/ distinct=[0-9]* //; s/  */ /g; s/ GB\/s (expert bytes/ GB\/s (/' | cut -c1-120; }
echo "== new"; grep -E "^mxfp4 .*T=(1|16|64) " "$out/bench_moe.log" | short
grep -E "^(nvfp4|route)|^mxfp4 bt0 .*T=(2|4|8|32|128|4096) " "$out/bench_moe.log" | short
echo "== old"; grep -E "^mxfp4 .*T=(1|16|64) |^route" "$out/bench_moe_old.log" | short | head -40
