#!/usr/bin/env bash
# h-moe8 (session 8): one device call for the FP8 path's f16 variant (e2m1 placed into f16 bits,
# mma.sync m16n8k16 f16). Runs the carried binaries (built locally for sm_90a, copied with this
# script to build/h8-moe-carry/ of the device tree): SASS opcode counts of the decode GEMM loops
# (cuobjdump), test_moe_cuda, bench_moe (moe.json), compute-sanitizer memcheck on tiny cases.
# Logs go to OUT_DIR (default $OUT) as one tarball; the summary is printed last.
#   build/h8-moe-carry/run.sh [OUT_DIR]      env: FILTER (gtest filter), T_TEST, T_BENCH, T_MEMCHECK
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-${OUT:-/tmp/h_moe8_out}}"
logs="$out/logs"
mkdir -p "$logs"
bt="$here/test_moe_cuda"
bb="$here/bench_moe"
export DS_COMMIT="${DS_COMMIT:-$(cat "$here/commit.txt" 2>/dev/null || echo unknown)}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv >"$logs/gpu.txt" 2>&1
t0=$(date +%s)
rc_x=skipped
cuobj="$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)"
if [ -n "$cuobj" ]; then
  timeout 60 "$cuobj" -sass "$bb" >"$logs/all.sass" 2>"$logs/cuobjdump.err"
  rc_x=$?
  # (mangled) expert_gemm_f8_kernel<1, true|false, 4|2, 8192, false|true>
  for ks in 4 2 1; do
    for fused in Lb1E Lb0E; do
      for h16 in Lb0E Lb1E; do
        timeout 30 python3 "$here/sass_hist.py" "$logs/all.sass" expert_gemm_f8_kernel \
          "ILi1E${fused}Li${ks}ELi8192E${h16}" >>"$logs/sass_hist.txt" 2>&1
      done
    done
  done
  python3 - "$logs/all.sass" >"$logs/f8_kernels.sass" <<'PY'
import re, sys
t = open(sys.argv[1], errors="replace").read()
for f in re.split(r"\n\s*Function : ", t)[1:]:
    n = f.split("\n", 1)[0]
    if "expert_gemm_f8_kernel" in n and "ILi1ELb1ELi4ELi8192E" in n:
        print("Function : " + f)
PY
  rm -f "$logs/all.sass"
fi
t1=$(date +%s)
timeout "${T_TEST:-150}" "$bt" ${FILTER:+--gtest_filter=$FILTER} >"$logs/test_moe_cuda.log" 2>&1
rc_t=$?
t2=$(date +%s)
timeout "${T_BENCH:-200}" "$bb" "$out/moe.json" >"$logs/bench_moe.log" 2>&1
rc_b=$?
t3=$(date +%s)
rc_s=skipped
if command -v compute-sanitizer >/dev/null && [ "${T_MEMCHECK:-45}" -gt 0 ]; then
  timeout "${T_MEMCHECK:-45}" compute-sanitizer --tool memcheck --error-exitcode 1 "$bt" \
    --gtest_filter='MoeCuda.TinyUniformMxfp4:MoeCuda.TinySkewed:MoeCuda.RouterGateFormats' \
    >"$logs/memcheck.log" 2>&1
  rc_s=$?
fi
t4=$(date +%s)
(cd "$out" && tar czf logs.tgz logs && rm -rf logs/test_moe_cuda.log.unused)
echo "==== SASS (decode GEMM loops)"
grep -E "^====|loop" "$logs/sass_hist.txt" 2>/dev/null | sed "s/_ZN2ds4cuda.*expert_gemm_f8_kernel//" | cut -c1-200 | head -80
echo "==== test_moe_cuda"
grep -E "Failure|Expected|Which is|worst|error:" "$logs/test_moe_cuda.log" | head -20
grep -E "\] T=" "$logs/test_moe_cuda.log" | sed -E 's/ oracle=.*\(/ (/; s/ mean_err.*//' | \
  awk '{k=$0; sub(/ T=.*/, "", k); if (!(k in n)) order[++m]=k; n[k]++; last[k]=$0} END {for (i=1;i<=m;i++) print n[order[i]] "x " last[order[i]]}' | head -40
echo "==== bench_moe"
grep -vE "^route" "$logs/bench_moe.log" | sed 's/ distinct=[0-9]* //; s/  */ /g' | cut -c1-200 | head -90
grep -E "^route|ceilings" "$logs/bench_moe.log"
echo "==== memcheck"; grep -E "ERROR SUMMARY|Invalid" "$logs/memcheck.log" 2>/dev/null | head -5
echo "==== summary"
grep -E "^\[ +(OK|FAILED|PASSED) " "$logs/test_moe_cuda.log" | tail -22
echo "sass rc=$rc_x ($((t1 - t0))s) test rc=$rc_t ($((t2 - t1))s) bench rc=$rc_b ($((t3 - t2))s) memcheck rc=$rc_s ($((t4 - t3))s) commit=$DS_COMMIT"
