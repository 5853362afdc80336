#!/usr/bin/env bash
# Session 28, call 3: test_ops_cuda (the HCA cluster kernel), bench_ops (ops.json), and ncu
# --set full of the first decode-step mhc_fused_kernel launch at B = 1 and B = 64 (Flash 4 layers,
# context 512) to see what bounds mHC pre at decode sizes.
# Binaries: build/carry/backend.tar.xz.
#   scripts/gpu/h_step28/call2.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call2.sh OUT}"
c=/tmp/carry_s28
mkdir -p "$out/logs"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
summary=()
for t in ${TESTS-test_ops_cuda}; do
  timeout 300 "$c/$t" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$out/logs/$t.log" 2>&1
  summary+=("$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/logs/$t.log" | tr '\n' ' ')")
  grep -E '^\[  FAILED  \]|Failure' "$out/logs/$t.log" | head -20
done
if [ "${OPS:-1}" = 1 ]; then
  timeout 200 "$c/bench_ops" "$out/ops.json" >"$out/logs/bench_ops.log" 2>&1
  summary+=("bench_ops rc=$?")
  grep -E "mhc|compressor" "$out/logs/bench_ops.log" | grep -v graph | head -30
fi
export DEEPSERVE_CACHE_DIR=/dev/shm/deepserve-cache
model=/dev/shm/flash4
[ -d "$model" ] || "$c/deepserve" make-checkpoint --preset flash --layers 4 --out "$model" \
  --no-verify >"$out/logs/make_flash.log" 2>&1 || { echo "make-checkpoint failed"; exit 1; }
for b in ${NCU_B-1 64}; do
  timeout 200 ncu --clock-control none --set full -k "regex:${NCU_K:-mhc_fused}" --launch-count 1 \
    -o "$out/logs/ncu_mhc_b$b" "$c/deepserve" profile --device cuda --model "$model" \
    --batch "$b" --context 512 --steps 1 --warmup 0 --graphs \
    --output "$out/logs/ncu_prof_b$b.json" >"$out/logs/ncu_mhc_b$b.log" 2>&1
  ncu --import "$out/logs/ncu_mhc_b$b.ncu-rep" --page details >"$out/logs/ncu_mhc_b$b.txt" 2>&1
  ncu --import "$out/logs/ncu_mhc_b$b.ncu-rep" --page raw --csv \
    --metrics smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_long_scoreboard \
    >/dev/null 2>&1
  summary+=("ncu B=$b: $(grep -E 'Duration' "$out/logs/ncu_mhc_b$b.txt" | head -1)")
done
tar -C "$out" -czf "$out/results.tgz" logs && rm -rf "$out/logs"
printf '%s\n' "${summary[@]}"
