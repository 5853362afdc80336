#!/usr/bin/env bash
# h-moe18 (session 18): one device call for the sm_90a prefill path (expert_gemm_wg_kernel).
# Runs scripts/gpu/run_moe.sh on the carried binaries (build/h-moe/..., built locally for sm_90a:
# test_moe_cuda with compute-sanitizer memcheck of MoeCuda.Tiny*, then bench_moe -> moe.json), and
# writes the SASS of the wgmma kernels with an opcode histogram of each (cuobjdump).
#   scripts/gpu/h_moe18/run.sh [OUT_DIR]     env: as run_moe.sh (MOE_TEST_FILTER, ...)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:-${OUT:-/tmp/h_moe18_out}}"
mkdir -p "$out"
MOE_SANITIZE="${MOE_SANITIZE:-1}" MOE_TEST_TIMEOUT="${MOE_TEST_TIMEOUT:-280}" \
  MOE_BENCH_TIMEOUT="${MOE_BENCH_TIMEOUT:-200}" bash scripts/gpu/run_moe.sh "$out"
rc=$?
cuobj="$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)"
if [ -n "$cuobj" ]; then
  timeout 60 "$cuobj" -sass build/h-moe/bench/bench_moe 2>/dev/null | python3 -c '
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
