#!/usr/bin/env bash
# h-gemm15 (issue 5, session 15): device calls with the binaries of scripts/gpu/pack_backend.sh
# (carry build/carry). Steps: a test binary by name (test_gemm_cuda, test_ops_cuda,
# test_cuda_ops ...), "prefetch" (bench_gemm_fp8 prefetch: no PDL / PDL / PDL + the L2 prefetch
# on the engine's plans), "bench_ops", and "ab:VAR" (the step A/B of an environment switch,
# scripts/gpu/ab_switch.sh: Flash 4 layers, B = 1 / 16 / 64, context 512).
#   OUT=... bash scripts/gpu/h_gemm15/run.sh STEP...
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-/tmp/h_gemm15_out}"
mkdir -p "$out"
c=/tmp/carry15
rm -rf "$c" && mkdir -p "$c" && xz -dc build/carry/backend.tar.xz | tar -C "$c" -xf -
export LD_LIBRARY_PATH="$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
S="$out/summary.txt"
say() { echo "$*" | tee -a "$S"; }
say "$(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv,noheader | head -1)"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(test_gemm_cuda prefetch ab:DEEPSERVE_GEMM_L2_PREFETCH)
for st in "${steps[@]}"; do
  case $st in
    test_*)
      # test_x:FILTER runs the binary test_x with --gtest_filter=FILTER.
      bin="${st%%:*}"; filt=""; [ "$bin" != "$st" ] && filt="--gtest_filter=${st#*:}"
      st="$bin"
      timeout 300 "$c/$bin" $filt >"$out/$st.log" 2>&1
      x=$?
      say "$st: rc=$x $(grep -E '^\[  (PASSED|FAILED) ' "$out/$st.log" | tr '\n' ' ') ($(el)s)"
      [ $x -eq 0 ] || { grep -E '^\[  FAILED' "$out/$st.log" | tee -a "$S"; grep -B2 -A8 -m 8 "Failure" "$out/$st.log" | head -60 | tee -a "$S"; }
      ;;
    prefetch)
      timeout 200 "$c/bench_gemm_fp8" "$out/gemm_fp8_prefetch.json" prefetch >"$out/bench_prefetch.log" 2>&1
      say "bench prefetch rc=$? ($(el)s)"
      grep -E "^ceilings|floor .* us \|" "$out/bench_prefetch.log" | cut -c1-300 | tee -a "$S" >/dev/null
      ;;
    bench_ops)
      timeout 200 "$c/bench_ops" "$out/ops.json" >"$out/bench_ops.log" 2>&1
      say "bench_ops rc=$? ($(el)s)"
      grep -E "^(rms_norm|rope_q|norm_rope)" "$out/bench_ops.log" | tee -a "$S" >/dev/null
      ;;
    ab:*)
      BENCH_OPS=0 timeout 330 bash scripts/gpu/ab_switch.sh "$out" "${st#ab:}" 4 40 | tee -a "$S"
      say "ab ${st#ab:} done ($(el)s)"
      ;;
  esac
done
cat "$S"
