#!/usr/bin/env bash
# Session 29: one device call for the MoE decode work, all binaries carried in
# build/carry/backend.tar.xz (packed as scripts/gpu/pack_backend.sh does), nothing built there:
#   1. the GPU tests in TESTS (default: test_moe_cuda test_ops_cuda test_cuda_ops), GTEST_FILTER;
#   1b. SANITIZE_FILTER: compute-sanitizer memcheck of those test_moe_cuda cases;
#   2. bench_moe restricted to MOE_CASES (DS_MOE_CASES syntax, see bench_moe.cu), MOE_ROUNDS
#      rounds (default 2; the last round's JSON -> OUT/moe_ab.json); the forward and GEMM lines;
#   3. FULL_BENCH=1: the whole bench_moe -> OUT/moe.json;
#   4. AB_B batches: deepserve profile --graphs of a Flash 4-layer checkpoint at context 512,
#      alternating AB_ON / AB_OFF environments (strings of VAR=VALUE), AB_ROUNDS rounds;
#   5. EV_B batches (after AB_B, which makes the checkpoint): event-timed component profiles.
#   scripts/gpu/h_s29/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call.sh OUT}"
c=/tmp/carry_s29
mkdir -p "$out/logs"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader >"$out/gpu.txt"
summary=("gpu: $(cat "$out/gpu.txt")")
for t in ${TESTS-test_moe_cuda test_ops_cuda test_cuda_ops}; do
  timeout 300 "$c/$t" ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$out/logs/$t.log" 2>&1
  summary+=("$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/logs/$t.log" | tr '\n' ' ')")
  grep -E '^\[  FAILED  \]|Failure' "$out/logs/$t.log" | head -20
done
if [ -n "${SANITIZE_FILTER-}" ]; then  # compute-sanitizer memcheck of test_moe_cuda cases
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$c/test_moe_cuda" \
    --gtest_filter="$SANITIZE_FILTER" >"$out/logs/memcheck.log" 2>&1
  summary+=("memcheck rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$out/logs/memcheck.log" | tr '\n' ' ')")
fi
if [ -n "${MOE_CASES-}" ]; then
  for i in $(seq "${MOE_ROUNDS:-2}"); do
    echo "== bench_moe round $i" | tee -a "$out/moe_ab.txt"
    DS_MOE_CASES="$MOE_CASES" timeout 200 "$c/bench_moe" "$out/moe_ab.json" 2>&1 |
      grep -E "^(mxfp4|nvfp4) |expert GEMMs|nodes|^ceil" | tee -a "$out/moe_ab.txt" >/dev/null
  done
  summary+=("bench_moe cases done: $(grep -c '^mxfp4\|^nvfp4' "$out/moe_ab.txt") rows")
fi
if [ "${FULL_BENCH:-0}" = 1 ]; then
  timeout 300 "$c/bench_moe" "$out/moe.json" >"$out/logs/bench_moe_full.log" 2>&1
  summary+=("bench_moe full rc=$?")
fi
if [ -n "${AB_B-}" ]; then
  export DEEPSERVE_CACHE_DIR=/dev/shm/deepserve-cache
  model=/dev/shm/flash4
  [ -d "$model" ] || "$c/deepserve" make-checkpoint --preset flash --layers 4 --out "$model" \
    --no-verify >"$out/logs/make_flash.log" 2>&1 || { echo "make-checkpoint failed"; exit 1; }
  mkdir -p "$out/ab"
  for b in $AB_B; do
    for round in $(seq 1 "${AB_ROUNDS:-2}"); do
      for v in on off; do
        name="profile_flash4_b${b}_${v}_r${round}"
        envs=()
        if [ "$v" = on ]; then read -ra envs <<<"${AB_ON-}"; else read -ra envs <<<"${AB_OFF-}"; fi
        env "${envs[@]}" timeout 120 "$c/deepserve" profile --device cuda --model "$model" \
          --batch "$b" --context 512 --steps 40 --warmup 5 --graphs \
          --output "$out/ab/$name.json" >"$out/logs/$name.log" 2>&1
        summary+=("$(printf 'B=%-3s %-3s round %s rc=%s  %s' "$b" "$v" "$round" "$?" \
          "$(grep -E '^step' "$out/logs/$name.log" | head -1)")")
      done
    done
  done
fi
for b in ${EV_B-}; do  # event-timed components of the default build
  mkdir -p "$out/ab"
  name="profile_flash4_b${b}_c512_graphs_events"
  timeout 120 "$c/deepserve" profile --device cuda --model /dev/shm/flash4 --batch "$b" \
    --context 512 --steps 40 --warmup 5 --graphs --event-timing --output "$out/ab/$name.json" \
    >"$out/logs/$name.log" 2>&1
  summary+=("events B=$b rc=$? $(grep -E '^step' "$out/logs/$name.log" | head -1)")
done
tar -C "$out" -czf "$out/results.tgz" logs $( [ -d "$out/ab" ] && echo ab ) && rm -rf "$out/logs" "$out/ab"
printf '%s\n' "${summary[@]}"
