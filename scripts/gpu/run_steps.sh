#!/usr/bin/env bash
# Device calls as a list of steps, with the binaries that scripts/gpu/pack_backend.sh packed into
# build/carry (pass build/carry as the `run` tool's carry). The generic successor of the
# per-session scripts/gpu/h_*/run.sh. Steps:
#   test_x[:FILTER]  a test binary (optionally --gtest_filter=FILTER)
#   mla[:quick]      bench_sparse_mla -> $OUT/sparse_mla_decode.json
#   bench_ops        bench_ops -> $OUT/ops.json
#   sampling         bench_ops, the sampling kernels only -> $OUT/ops_sampling.json
#   prefetch         bench_gemm_fp8 prefetch mode -> $OUT/gemm_fp8_prefetch.json
#   ab:VAR           the step A/B of an environment switch (scripts/gpu/ab_switch.sh: Flash 4
#                    layers, B = 1 / 16 / 64, context 512)
#   sanitize:test_x[:FILTER]  the test under compute-sanitizer memcheck
#   OUT=... bash scripts/gpu/run_steps.sh STEP...
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/run_steps_out}"
mkdir -p "$out"
c=/tmp/carry_steps
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c"
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
S="$out/summary.txt"
say() { echo "$*" | tee -a "$S"; }
say "$(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv,noheader | head -1)"
run_test() {  # run_test PREFIX BIN[:FILTER]
  local pre="$1" st="$2" bin filt="" x
  bin="${st%%:*}"; [ "$bin" != "$st" ] && filt="--gtest_filter=${st#*:}"
  timeout 300 $pre "$c/$bin" $filt >"$out/$bin.log" 2>&1
  x=$?
  say "${pre:+sanitize }$bin: rc=$x $(grep -E '^\[  (PASSED|FAILED) |ERROR SUMMARY' "$out/$bin.log" | tr '\n' ' ') ($(el)s)"
  [ $x -eq 0 ] || { grep -E '^\[  FAILED' "$out/$bin.log" | tee -a "$S"; grep -B2 -A8 -m 8 "Failure\|Error" "$out/$bin.log" | head -60 | tee -a "$S"; }
}
for st in "$@"; do
  case $st in
    test_*) run_test "" "$st" ;;
    sanitize:*) run_test "compute-sanitizer --tool memcheck" "${st#sanitize:}" ;;
    mla|mla:*)
      mode=""; [ "$st" = "mla:quick" ] && mode=quick
      timeout 400 "$c/bench_sparse_mla" "$out/sparse_mla_decode.json" $mode >"$out/bench_mla.log" 2>&1
      say "bench_sparse_mla $mode rc=$? ($(el)s)"
      grep -E "^ceilings|sparse_mla" "$out/bench_mla.log" | cut -c1-200 | tee -a "$S" >/dev/null
      ;;
    bench_ops)
      timeout 200 "$c/bench_ops" "$out/ops.json" >"$out/bench_ops.log" 2>&1
      say "bench_ops rc=$? ($(el)s)"
      ;;
    sampling)
      timeout 200 "$c/bench_ops" "$out/ops_sampling.json" sampling >"$out/bench_sampling.log" 2>&1
      say "bench_ops sampling rc=$? ($(el)s)"
      grep -E "^(copy|sample)" "$out/bench_sampling.log" | tee -a "$S" >/dev/null
      ;;
    prefetch)
      timeout 200 "$c/bench_gemm_fp8" "$out/gemm_fp8_prefetch.json" prefetch >"$out/bench_prefetch.log" 2>&1
      say "bench prefetch rc=$? ($(el)s)"
      ;;
    ab:*)
      BENCH_OPS=0 timeout 330 bash scripts/gpu/ab_switch.sh "$out" "${st#ab:}" 4 40 | tee -a "$S"
      say "ab ${st#ab:} done ($(el)s)"
      ;;
    *) say "unknown step $st" ;;
  esac
done
cat "$S"
