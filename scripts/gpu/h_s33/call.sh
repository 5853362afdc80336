#!/usr/bin/env bash
# Session 33 (issue 6): v9 with the in-place producer. Binaries in build/carry (packed by
# scripts/gpu/h_s29/pack.sh build/full-cuda test_sparse_mla_cuda bench_sparse_mla test_cuda_ops,
# then VARIANTS="1 2 3" scripts/gpu/h_s32/build_ablations.sh for the timing-only variants):
#   1. smoke test (FlashBatch1, 60 s: a deadlock stops here), test_sparse_mla_cuda whole;
#   2. compute-sanitizer memcheck / racecheck of SANITIZE_FILTER (SANITIZE=0 skips);
#   3. bench_sparse_mla quick (FULL=1: whole) -> OUT/mla.json, ROUNDS=n more quick rounds;
#   4. the variant tests (test_sparse_mla_cuda_V) and benches (bench_sparse_mla_V, V = wsN for
#      the ablations) found in build/carry -> OUT/mla_V.json; bench_sparse_mla_trace*: the phase
#      table of trace_summary.py;
#   5. test_cuda_ops (TESTS_OPS=0 skips); 6. NCU=1: ncu of v9's first launch in FlashBatch128
#      (B = 128, one split) -> OUT/ncu.txt; 7. spills of the v9 kernel (cuobjdump).
# Tables by scripts/gpu/h_s32/summary.py into OUT/table.txt. At most 8 files in OUT.
#   scripts/gpu/h_s33/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call.sh OUT}"
c=/tmp/carry_s33
mkdir -p "$out/logs"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
export DS_COMMIT="$(tr '\n' ' ' <build/carry/COMMIT)"
s=("gpu: $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader) commit $DS_COMMIT")
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
res() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; }
timeout 60 "$c/test_sparse_mla_cuda" --gtest_filter='SparseMlaCuda.FlashBatch1' >"$out/logs/smoke.log" 2>&1
rc=$?
s+=("smoke rc=$rc $(res "$out/logs/smoke.log") $(el)")
if [ $rc -ne 124 ]; then
  timeout 300 "$c/test_sparse_mla_cuda" >"$out/logs/test.log" 2>&1
  s+=("test_sparse_mla_cuda rc=$? $(res "$out/logs/test.log") $(el)")
  grep -E '^\[  FAILED  \]|Failure' "$out/logs/test.log" | head -20
  if [ "${SANITIZE:-1}" = 1 ]; then
    for tool in memcheck racecheck; do
      timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 "$c/test_sparse_mla_cuda" \
        --gtest_filter="${SANITIZE_FILTER-SparseMlaCuda.FlashSpeculativeBatch4:SparseMlaCuda.FlashShortLengthsAndMasks}" \
        >"$out/logs/$tool.log" 2>&1
      s+=("$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/logs/$tool.log" | tr '\n' ' ') $(el)")
    done
  fi
  timeout 240 "$c/bench_sparse_mla" "$out/mla.json" $([ "${FULL:-0}" = 1 ] || echo quick) \
    >"$out/logs/bench.log" 2>&1
  s+=("bench rc=$? $(el)")
  { echo "== tree"; python3 scripts/gpu/h_s32/summary.py "$out/mla.json"; } >>"$out/table.txt" 2>&1
  for r in $(seq 2 "${ROUNDS:-1}"); do
    timeout 90 "$c/bench_sparse_mla" "$out/logs/mla_r$r.json" quick >"$out/logs/bench_r$r.log" 2>&1
    { echo "== tree, round $r"; python3 scripts/gpu/h_s32/summary.py "$out/logs/mla_r$r.json"; } >>"$out/table.txt" 2>&1
  done
  for tb in build/carry/test_sparse_mla_cuda_*; do  # variants (build_variant.sh)
    [ -x "$tb" ] || continue
    v=${tb##*/test_sparse_mla_cuda_}
    timeout 120 "$tb" >"$out/logs/test_$v.log" 2>&1
    s+=("test_sparse_mla_cuda_$v rc=$? $(res "$out/logs/test_$v.log") $(el)")
    grep -E '^\[  FAILED  \]|Failure' "$out/logs/test_$v.log" | head -10
  done
  for b in build/carry/bench_sparse_mla_*; do  # ablations (wsN) and variants
    [ -x "$b" ] || continue
    v=${b##*/bench_sparse_mla_}
    if [[ $v == trace* ]]; then  # DS_SPARSE_MLA_WS_TRACE builds: phase stamps of one CTA
      timeout 90 "$b" "$out/logs/mla_$v.json" quick >"$out/logs/bench_$v.log" 2>&1
      s+=("bench $v rc=$? $(el)")
      { echo "== $v"; python3 scripts/gpu/h_s33/trace_summary.py <"$out/logs/bench_$v.log"; } >>"$out/table.txt" 2>&1
      continue
    fi
    timeout 90 "$b" "$out/mla_$v.json" quick >"$out/logs/bench_$v.log" 2>&1
    s+=("bench $v rc=$? $(el)")
    { echo "== variant $v"; python3 scripts/gpu/h_s32/summary.py "$out/mla_$v.json"; } >>"$out/table.txt" 2>&1
  done
  if [ "${TESTS_OPS:-1}" = 1 ]; then
    timeout 200 "$c/test_cuda_ops" >"$out/logs/test_cuda_ops.log" 2>&1
    s+=("test_cuda_ops rc=$? $(res "$out/logs/test_cuda_ops.log") $(el)")
    grep -E '^\[  FAILED  \]|Failure' "$out/logs/test_cuda_ops.log" | head -10
  fi
fi
if [ "${NCU:-0}" = 1 ] && [ $rc -ne 124 ]; then
  mkdir -p "$out/logs/ncu"
  timeout 200 ncu --clock-control none --kernel-name regex:ws_kernel --launch-count 1 --set full \
    --import-source yes --warp-sampling-interval 5 -f -o /tmp/ws_prof "$c/test_sparse_mla_cuda" \
    --gtest_filter=SparseMlaCuda.FlashBatch128 >"$out/logs/ncu/ncu.log" 2>&1
  s+=("ncu rc=$? $(el)")
  scripts/gpu/ncu_summary.sh /tmp/ws_prof.ncu-rep "$out/logs/ncu" 60 >"$out/ncu.txt" 2>&1
  rm -f "$out/logs/ncu/source.csv"
fi
cuobjdump -sass "$c/test_sparse_mla_cuda" 2>/dev/null |
  awk '/Function : .*sparse_mla_decode_ws_kernel/{f=1} /Function : /&&!/ws_kernel/{f=0} f' >/tmp/ws.sass
s+=("ws kernel SASS lines: $(wc -l </tmp/ws.sass), STL/LDL: $(grep -c 'STL\|LDL' /tmp/ws.sass)")
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
[ -f "$out/table.txt" ] && cat "$out/table.txt"
printf '%s\n' "${s[@]}" | tee "$out/summary.txt"
