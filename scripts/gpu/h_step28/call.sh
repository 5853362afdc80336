#!/usr/bin/env bash
# Session 28: GPU tests of the decode-glue changes, then decode steps with them on / off.
#   1. test_elementwise_cuda, test_ops_cuda, test_cuda_ops (TESTS="" skips them);
#   2. deepserve profile --graphs of a Flash 4-layer checkpoint at context 512, B in AB_B (default
#      "1 64"), alternating the new paths on (default) / off (AB_OFF, default
#      "DEEPSERVE_FUSED_COMPRESS=0 DEEPSERVE_FUSED_OUTPUT_ROPE=0"), AB_ROUNDS rounds (default 2);
#   3. EV_B batches: event-timed component profiles (everything on); OPS=1: bench_ops;
#   4. KB batches: ncu per-kernel breakdown of a step (step_kernels_summary.py), default "1".
# Binaries: build/carry/backend.tar.xz (deepserve, bench_ops and the three test binaries).
#   scripts/gpu/h_step28/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call.sh OUT}"
c=/tmp/carry_s28
mkdir -p "$out/logs" "$out/ab"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
summary=()
for t in ${TESTS-test_elementwise_cuda test_ops_cuda test_cuda_ops}; do
  timeout 300 "$c/$t" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$out/logs/$t.log" 2>&1
  summary+=("$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/logs/$t.log" | tr '\n' ' ')")
  grep -E '^\[  FAILED  \]|Failure|metric' "$out/logs/$t.log" | head -20
done
export DEEPSERVE_CACHE_DIR=/dev/shm/deepserve-cache
model=/dev/shm/flash4
[ -d "$model" ] || "$c/deepserve" make-checkpoint --preset flash --layers 4 --out "$model" \
  --no-verify >"$out/logs/make_flash.log" 2>&1 || { echo "make-checkpoint failed"; exit 1; }
off="${AB_OFF-DEEPSERVE_FUSED_COMPRESS=0 DEEPSERVE_FUSED_OUTPUT_ROPE=0}"
for b in ${AB_B-1 64}; do
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for v in on off; do
      name="profile_flash4_b${b}_${v}_r${round}"
      envs=()
      [ "$v" = off ] && read -ra envs <<<"$off"
      env "${envs[@]}" timeout 120 "$c/deepserve" profile --device cuda --model "$model" \
        --batch "$b" --context 512 --steps 40 --warmup 5 --graphs \
        --output "$out/ab/$name.json" >"$out/logs/$name.log" 2>&1
      summary+=("$(printf 'B=%-3s %-3s round %s rc=%s  %s' "$b" "$v" "$round" "$?" \
        "$(grep -E '^step' "$out/logs/$name.log" | head -1)")")
    done
  done
done
for b in ${EV_B-}; do  # event-timed components, everything on
  name="profile_flash4_b${b}_c512_graphs_events"
  timeout 120 "$c/deepserve" profile --device cuda --model "$model" --batch "$b" --context 512 \
    --steps 40 --warmup 5 --graphs --event-timing --output "$out/ab/$name.json" \
    >"$out/logs/$name.log" 2>&1
  summary+=("events B=$b rc=$? $(grep -E '^step' "$out/logs/$name.log" | head -1)")
done
if [ "${OPS:-0}" = 1 ]; then
  timeout 200 "$c/bench_ops" "$out/ops.json" >"$out/logs/bench_ops.log" 2>&1
  summary+=("bench_ops rc=$? $(grep -E '^compressor_hca' "$out/logs/bench_ops.log" | head -3 | tr -s ' ' | tr '\n' ';')")
fi
for b in ${KB-1}; do
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$c/deepserve" profile --device cuda --model "$model" --batch "$b" --context 512 \
    --steps 2 --warmup 1 --graphs --output "$out/logs/ncu_step_b$b.json" \
    >"$out/logs/ncu_b$b.csv" 2>"$out/logs/ncu_b$b.err"
  python3 scripts/gpu/step_kernels_summary.py "$out/logs/ncu_b$b.csv" >"$out/logs/summary_b$b.txt" 2>&1
  summary+=("ncu B=$b: $(head -1 "$out/logs/summary_b$b.txt")")
done
tar -C "$out" -czf "$out/results.tgz" logs ab && rm -rf "$out/logs" "$out/ab"
printf '%s\n' "${summary[@]}"
