#!/usr/bin/env bash
# h-moe18 (session 18): one device call for the sm_90a prefill path (expert_gemm_wg_kernel).
# Runs scripts/gpu/run_moe.sh on the carried binaries (built locally for sm_90a and packed, stripped,
# into build/c18/bins.tar.xz with the shared libraries the GPU machine lacks: test_moe_cuda with
# compute-sanitizer memcheck of MoeCuda.Tiny*, then bench_moe -> moe.json), the whole-model test
# test_cuda_ops (its prefill chunks of > 128 tokens run the MoE prefill tiles), and writes the SASS
# of the wgmma kernels with an opcode histogram of each (cuobjdump).
#   scripts/gpu/h_moe18/run.sh [OUT_DIR]     env: as run_moe.sh (MOE_TEST_FILTER, ...), SKIP_OPS=1,
#   SKIP_MOE=1 (no test_moe_cuda / bench_moe run: an NCU-only call), SKIP_SASS=1 (no cuobjdump),
#   BINS (the packed binaries, default build/c18/bins.tar.xz; session 19's are build/c19/...),
#   NCU=1: ncu (--set full, SASS stall samples) of the first gate/up + down wgmma launches of each
#   bench case in NCU_CASES (default "mxfp4:4096:0:0 mxfp4:4096:4:1": the default path and the
#   tiles-first grid order at T = 4096; bench_moe's DS_MOE_CASES "fmt:T:path:raster" selects
#   them), summaries in ncu_<case>.txt
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe18_out}}"
mkdir -p "$out"
c=/tmp/c18
. scripts/gpu/unpack_bins.sh && unpack_bins "${BINS:-build/c18/bins.tar.xz}" "$c"
export MOE_TEST_BIN="$c/test_moe_cuda" MOE_BENCH_BIN="$c/bench_moe"
rc=0
if [ "${SKIP_MOE:-0}" != 1 ]; then
  MOE_SANITIZE="${MOE_SANITIZE:-1}" MOE_TEST_TIMEOUT="${MOE_TEST_TIMEOUT:-280}" \
    MOE_BENCH_TIMEOUT="${MOE_BENCH_TIMEOUT:-200}" bash scripts/gpu/run_moe.sh "$out"
  rc=$?
fi
if [ "${SKIP_OPS:-0}" != 1 ]; then
  timeout 240 "$c/test_cuda_ops" >"$out/test_cuda_ops.log" 2>&1
  echo "test_cuda_ops rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_cuda_ops.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/test_cuda_ops.log"
fi
if [ "${NCU:-0}" = 1 ]; then
  for sel in ${NCU_CASES:-mxfp4:4096:0:0 mxfp4:4096:4:1}; do
    tag="${sel//:/_}"
    DS_MOE_CASES="$sel" timeout 300 ncu --clock-control none --kernel-name regex:expert_gemm_wg_kernel \
      --launch-count 2 --set full --import-source yes -f -o "/tmp/ncu_$tag" "$c/bench_moe" \
      "/tmp/ncu_$tag.json" >"/tmp/ncu_$tag.log" 2>&1
    echo "ncu $sel rc=$?"
    ncu -i "/tmp/ncu_$tag.ncu-rep" --page details >"$out/ncu_$tag.txt" 2>&1
    ncu -i "/tmp/ncu_$tag.ncu-rep" --page source --csv --print-source=sass >"/tmp/ncu_$tag.csv" 2>&1
    python3 scripts/gpu/h_mla16/sass_top.py "/tmp/ncu_$tag.csv" 30 >"$out/ncu_${tag}_sass.txt" 2>&1
    grep -E "expert_gemm_wg|Duration|Issue Slots Busy|Eligible Warps|No Eligible|DRAM Throughput|L2 Hit|Memory Throughput|L2 Cache Throughput|L1\/TEX Cache Throughput|Compute \(SM\) Throughput|Executed Ipc Active" \
      "$out/ncu_$tag.txt" | head -60
  done
fi
cuobj="$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)"
if [ -n "$cuobj" ] && [ "${SKIP_SASS:-0}" != 1 ]; then
  timeout 60 "$cuobj" -sass "$c/bench_moe" 2>/dev/null | python3 -c '
import collections, re, sys
t = sys.stdin.read()
out = open(sys.argv[1], "w")
for f in re.split(r"\n\s*Function : ", t)[1:]:
    name = f.split("\n", 1)[0]
    if "expert_gemm_wg_kernel" not in name:
        continue
    ops = collections.Counter(m.group(1).split(".")[0]
                              for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", f))
    print(name, sum(ops.values()), "instructions:", " ".join("%s %d" % kv for kv in ops.most_common(24)))
    out.write("Function : " + f)
' "$out/wg_kernels.sass"
fi
exit $rc
