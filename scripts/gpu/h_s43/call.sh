#!/usr/bin/env bash
# Session 43, one device call for issues 6 and 8. Binaries: scripts/gpu/h_s29/pack.sh build/full-cuda
# test_sparse_mla_cuda bench_sparse_mla test_moe_cuda bench_moe test_cuda_ops deepserve
# (carry ["build/carry"]). In order (the table is written as it goes, so a cut call keeps it):
#   1. test_sparse_mla_cuda, and that of each MLA variant packed (MLA_VARIANTS, default all: e.g.
#      `spec`, built by scripts/gpu/h_s33/build_variant.sh spec -DDS_SPARSE_MLA_SPEC_INDEX=1, then
#      scripts/gpu/h_s34/pack_variants.sh);
#   2. two rounds of bench_sparse_mla "small" (batch 1 and 4; the new 32 / 64-head rows), the tree
#      and the variants alternating -> table;
#   3. the full bench_sparse_mla -> OUT/mla_full.json;
#   4. MOE_ROUNDS (default 2) runs of bench_moe on MOE_CASES (default: T = 1, 2, 4, 8 default /
#      fused routing / PDL rows, T = 16 and 64 default) -> OUT/moe_r<N>.json;
#   5. each MoE timing-only variant packed (bench_moe_V: SRC=moe scripts/gpu/h_s33/build_variant.sh
#      abl1 -DDS_MOE_F8_ABLATE=1, abl2 ... =2, then scripts/gpu/h_s34/pack_variants.sh) on the
#      default rows; test_moe_cuda (MOE_TESTS, default all), then SANITIZERS on SANITIZE_TEST
#      (default the fused routing's tiny cases);
#   6. test_cuda_ops;
#   7. with AB=1 and at most AB_BEFORE seconds (default 330) spent: scripts/gpu/ab_switch.sh on
#      AB_VAR (default DEEPSERVE_MOE_ROUTE_IN_LOGITS; decode steps, Flash 4 layers) -> OUT/ab_*.tgz
#      (needs deepserve in the carry: with every binary above the tree and carry pass 64 MiB, so
#      pack it for a second call without the test binaries).
# Carry budget (tree + carry <= 64 MiB; the tracked tree is ~37 MB): the five binaries above pack
# to ~18 MB and `spec` to ~0.9 MB; bench_moe_abl1 adds ~9.7 MB, which with all of them passes the
# limit by ~0.4 MB: run the ablations in a second call (with deepserve for AB=1, or without
# test_cuda_ops). Session 43 packed them all, but no device was lent.
#   scripts/gpu/h_s43/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
out="${1:?usage: call.sh OUT}"
c=/tmp/carry_s43
mkdir -p "$out/logs"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
[ -f build/carry/variants.tar.xz ] && tar -C "$c" -xJf build/carry/variants.tar.xz
# Sparse MLA variants (scripts/gpu/h_s33/build_variant.sh + h_s34/pack_variants.sh), e.g. `spec`.
variants=${MLA_VARIANTS-$(cd "$c" && ls bench_sparse_mla_* 2>/dev/null | sed 's/^bench_sparse_mla_//')}
DS_COMMIT="$(tr "\n" " " <build/carry/COMMIT)"
export DS_COMMIT
t0=$(date +%s)
el() { echo "($(($(date +%s) - t0)) s)"; }
res() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; }
tab="$out/table.txt"
echo "gpu: $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader) commit $DS_COMMIT" >"$tab"
run_test() {  # BIN TIMEOUT [FILTER]
  local log="$out/logs/$1.log"
  [ -x "$c/$1" ] || { echo "$1 not packed" >>"$tab"; return; }
  timeout "$2" "$c/$1" ${3:+--gtest_filter="$3"} >"$log" 2>&1
  echo "$1 rc=$? $(res "$log") $(el)" >>"$tab"
  grep -E '^\[  FAILED  \]|Failure' "$log" | head -12 >>"$tab"
}
run_test test_sparse_mla_cuda 120
for v in $variants; do [ -x "$c/test_sparse_mla_cuda_$v" ] && run_test "test_sparse_mla_cuda_$v" 120; done
[ -x "$c/bench_sparse_mla" ] && for r in 1 2; do
  for v in "" $variants; do
    n="${v:-tree}_r$r"
    timeout 60 "$c/bench_sparse_mla${v:+_$v}" "$out/logs/mla_small_$n.json" small \
      >"$out/logs/bench_mla_$n.log" 2>&1
    echo "== mla small ${v:-tree} round $r: rc=$? $(el)" >>"$tab"
    python3 scripts/gpu/h_s38/small.py "$out/logs/mla_small_$n.json" >>"$tab" 2>&1
  done
done
cp "$out/logs/mla_small_tree_r1.json" "$out/mla_small_r1.json" 2>/dev/null
[ -x "$c/bench_sparse_mla" ] && timeout 150 "$c/bench_sparse_mla" "$out/mla_full.json" >"$out/logs/bench_mla_full.log" 2>&1
echo "bench_sparse_mla full rc=$? $(el)" >>"$tab"
cases="${MOE_CASES:-}"
if [ -z "$cases" ]; then
  for T in 1 2 4 8; do
    cases="$cases;mxfp4:$T:0:0;mxfp4:$T:0:0:r1"
    [ "$T" -le 2 ] && cases="$cases;mxfp4:$T:0:0:p;mxfp4:$T:0:0:r1:p"
  done
  cases="${cases#;};mxfp4:16:0:0;mxfp4:64:0:0"
fi
[ -x "$c/bench_moe" ] && for r in $(seq 1 "${MOE_ROUNDS:-2}"); do
  DS_MOE_CASES="$cases" timeout 150 "$c/bench_moe" "$out/moe_r$r.json" >"$out/logs/bench_moe_r$r.log" 2>&1
  echo "bench_moe round $r rc=$? $(el)" >>"$tab"
  grep -E "^(mxfp4|nvfp4) |nodes|^ceil" "$out/logs/bench_moe_r$r.log" |
    sed -E 's/ +/ /g' | cut -c1-230 >>"$tab"
done
# MoE timing-only variants (bench_moe_V, e.g. the FP8 GEMMs' ablations DS_MOE_F8_ABLATE=1 / 2):
# the default rows at T = 1, 2, 4, 16, 64 with their node breakdowns.
for b in $(cd "$c" && ls bench_moe_* 2>/dev/null); do
  DS_MOE_CASES="mxfp4:1:0:0;mxfp4:2:0:0;mxfp4:4:0:0;mxfp4:16:0:0;mxfp4:64:0:0" timeout 120 \
    "$c/$b" "$out/logs/$b.json" >"$out/logs/$b.log" 2>&1
  echo "$b rc=$? $(el)" >>"$tab"
  grep -E "^(mxfp4|nvfp4) |nodes|expert GEMMs" "$out/logs/$b.log" | sed -E 's/ +/ /g' |
    cut -c1-230 >>"$tab"
done
run_test test_moe_cuda 240 "${MOE_TESTS:-*}"
[ -x "$c/test_moe_cuda" ] && for tool in ${SANITIZERS-memcheck racecheck synccheck}; do
  timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 9 "$c/test_moe_cuda" \
    --gtest_filter="${SANITIZE_TEST:-MoeCuda.TinyRouteInLogitsKernel}" >"$out/logs/moe_$tool.log" 2>&1
  echo "$tool moe rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$out/logs/moe_$tool.log" | tr '\n' ' ') $(el)" >>"$tab"
done
run_test test_cuda_ops 200
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
if [ "${AB:-0}" = 1 ] && [ $(($(date +%s) - t0)) -le "${AB_BEFORE:-330}" ]; then
  scripts/gpu/ab_switch.sh "$out" "${AB_VAR:-DEEPSERVE_MOE_ROUTE_IN_LOGITS}" 4 40 >>"$tab" 2>&1
  echo "ab rc=$? $(el)" >>"$tab"
fi
cat "$tab"
