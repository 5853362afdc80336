#!/usr/bin/env bash
# Session 32, device call 1 (issue 6): v9 of the sparse MLA decode kernel (a producer warpgroup
# copies and dequantizes; sparse_mla_decode_ws.cuh). Binaries carried in build/carry/backend.tar.xz
# (scripts/gpu/h_s29/pack.sh build/full-cuda test_sparse_mla_cuda bench_sparse_mla test_cuda_ops):
#   1. a smoke test (FlashBatch1, 60 s: a deadlock stops here), then test_sparse_mla_cuda whole;
#   2. compute-sanitizer memcheck / racecheck of SANITIZE_FILTER;
#   3. bench_sparse_mla (quick unless FULL=1) -> OUT/mla.json, table by summary.py; ROUNDS=n;
#   4. test_cuda_ops (the engine's attention now plans v9);
#   5. NCU=1: ncu of v9's first launch in FlashBatch128 (B = 128, one split) -> OUT/ncu.txt;
#   6. the SASS lines of v9 that spill (cuobjdump).
# At most 8 files in OUT.
#   scripts/gpu/h_s32/call1.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call1.sh OUT}"
c=/tmp/carry_s32
mkdir -p "$out/logs"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader >"$out/gpu.txt"
s=("gpu: $(cat "$out/gpu.txt") commit $(cat build/carry/COMMIT | tr '\n' ' ')")
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
res() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; }
timeout 60 "$c/test_sparse_mla_cuda" --gtest_filter='SparseMlaCuda.FlashBatch1' >"$out/logs/smoke.log" 2>&1
rc=$?
s+=("smoke rc=$rc $(res "$out/logs/smoke.log") $(el)")
grep -E 'Failure|FAILED|error' "$out/logs/smoke.log" | head -20
if [ $rc -ne 124 ]; then
  timeout 300 "$c/test_sparse_mla_cuda" >"$out/logs/test_sparse_mla_cuda.log" 2>&1
  s+=("test_sparse_mla_cuda rc=$? $(res "$out/logs/test_sparse_mla_cuda.log") $(el)")
  grep -E '^\[  FAILED  \]|Failure' "$out/logs/test_sparse_mla_cuda.log" | head -20
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 "$c/test_sparse_mla_cuda" \
      --gtest_filter="${SANITIZE_FILTER-SparseMlaCuda.FlashSpeculativeBatch4:SparseMlaCuda.FlashShortLengthsAndMasks}" \
      >"$out/logs/$tool.log" 2>&1
    s+=("$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$out/logs/$tool.log" | tr '\n' ' ') $(el)")
  done
  for r in $(seq "${ROUNDS:-1}"); do
    j="$out/mla.json"
    [ "$r" -gt 1 ] && j="$out/mla_r$r.json"
    timeout 240 "$c/bench_sparse_mla" "$j" $([ "${FULL:-0}" = 1 ] || echo quick) \
      >"$out/logs/bench_r$r.log" 2>&1
    s+=("bench round $r rc=$? $(el)")
    python3 scripts/gpu/h_s32/summary.py "$j" >>"$out/table.txt" 2>&1
  done
  timeout 200 "$c/test_cuda_ops" >"$out/logs/test_cuda_ops.log" 2>&1
  s+=("test_cuda_ops rc=$? $(res "$out/logs/test_cuda_ops.log") $(el)")
  grep -E '^\[  FAILED  \]|Failure' "$out/logs/test_cuda_ops.log" | head -10
fi
if [ "${NCU:-0}" = 1 ] && [ $rc -ne 124 ]; then  # v9's first launch at B = 128 (one split)
  mkdir -p "$out/logs/ncu"
  timeout 200 ncu --clock-control none --kernel-name regex:ws_kernel --launch-count 1 --set full \
    --import-source yes --warp-sampling-interval 5 -f -o /tmp/ws_prof "$c/test_sparse_mla_cuda" \
    --gtest_filter=SparseMlaCuda.FlashBatch128 >"$out/logs/ncu/ncu.log" 2>&1
  s+=("ncu rc=$? $(el)")
  scripts/gpu/ncu_summary.sh /tmp/ws_prof.ncu-rep "$out/logs/ncu" 40 >"$out/ncu.txt" 2>&1
  rm -f "$out/logs/ncu/source.csv"
fi
cuobjdump -sass "$c/test_sparse_mla_cuda" 2>/dev/null |
  awk '/Function : .*sparse_mla_decode_ws_kernel/{f=1} /Function : /&&!/ws_kernel/{f=0} f' \
  >/tmp/ws.sass
{ echo "ws kernel SASS lines: $(wc -l </tmp/ws.sass)"; grep -n -B3 -A1 'STL\|LDL' /tmp/ws.sass | head -60; } >"$out/logs/spills.txt"
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
[ -f "$out/table.txt" ] && cat "$out/table.txt"
printf '%s\n' "${s[@]}" | tee "$out/summary.txt"
