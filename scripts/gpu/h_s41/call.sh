#!/usr/bin/env bash
# Session 41, one device call for issues 6 and 8. Binaries: scripts/gpu/h_s29/pack.sh build/full-cuda
# test_sparse_mla_cuda bench_sparse_mla test_moe_cuda bench_moe test_cuda_ops, then the MLA
# variants (scripts/gpu/h_s33/build_variant.sh + scripts/gpu/h_s34/pack_variants.sh), e.g.
# "bf16p|-DDS_SPARSE_MLA_BF16_PARTIALS=1|test_sparse_mla_cuda bench_sparse_mla".
#   1. test_sparse_mla_cuda of the tree and of each variant (FlashBatch1: split caps 1-40 bit for
#      bit, the oracle's tolerance);
#   2. MLA_ROUNDS (default 2) rounds of bench_sparse_mla "small" (batch 1 and 4): the tree, then each
#      variant, alternating -> logs; a table of the rows;
#   3. MLA_FULL=1: the tree's bench_sparse_mla full run -> OUT/mla_full.json; MLA_FULL_VARIANTS=
#      "V ...": the full run of bench_sparse_mla_V -> OUT/mla_full_V.json (before the MoE part since
#      session 42, so that a call cut at the 10 minutes keeps them);
#   4. MOE_CASES: bench_moe on those cases (MOE_TIMEOUT, default 150 s) -> OUT/moe_persist.json;
#      MOE_TESTS (a gtest filter, default the FP8 path's form tests; the persistent grid's were
#      removed in session 42) and SANITIZERS on SANITIZE_TEST (default MoeCuda.TinyUniformMxfp4);
#   5. TESTS_OPS=1: test_cuda_ops of the tree and of each variant that has one;
#   6. the table -> OUT/table.txt (printed last).
#   scripts/gpu/h_s41/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
out="${1:?usage: call.sh OUT}"
c=/tmp/carry_s41
mkdir -p "$out/logs"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
[ -f build/carry/variants.tar.xz ] && tar -C "$c" -xJf build/carry/variants.tar.xz
DS_COMMIT="$(tr "\n" " " <build/carry/COMMIT)"
export DS_COMMIT
t0=$(date +%s)
el() { echo "($(($(date +%s) - t0)) s)"; }
res() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; }
tab="$out/table.txt"
echo "gpu: $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader) commit $DS_COMMIT" >"$tab"
# MLA_VARIANTS="V ..." (session 42): only those of the packed variants.
variants=${MLA_VARIANTS:-$(cd "$c" && ls bench_sparse_mla_* 2>/dev/null | sed 's/^bench_sparse_mla_//')}
# test_variants BIN TIMEOUT: the tree's test binary BIN, then BIN_V of each variant that has one.
test_variants() {
  for v in "" $variants; do
    local t="$c/$1${v:+_$v}" log="$out/logs/$1_${v:-tree}.log"
    [ -x "$t" ] || continue
    timeout "$2" "$t" >"$log" 2>&1
    echo "$1 ${v:-tree} rc=$? $(res "$log") $(el)" >>"$tab"
    grep -E '^\[  FAILED  \]|Failure' "$log" | head -12 >>"$tab"
  done
}
test_variants test_sparse_mla_cuda 120
for r in $(seq 1 "${MLA_ROUNDS:-2}"); do
  for v in "" $variants; do
    timeout 60 "$c/bench_sparse_mla${v:+_$v}" "$out/logs/mla_small_${v:-tree}_r$r.json" small \
      >"$out/logs/bench_mla_${v:-tree}_r$r.log" 2>&1
    echo "== mla ${v:-tree}, round $r: rc=$? $(el)" >>"$tab"
    python3 scripts/gpu/h_s38/small.py "$out/logs/mla_small_${v:-tree}_r$r.json" >>"$tab" 2>&1
  done
done
if [ "${MLA_FULL:-0}" = 1 ]; then
  timeout 150 "$c/bench_sparse_mla" "$out/mla_full.json" >"$out/logs/bench_mla_full.log" 2>&1
  echo "bench_sparse_mla full rc=$? $(el)" >>"$tab"
fi
for v in ${MLA_FULL_VARIANTS:-}; do
  timeout 150 "$c/bench_sparse_mla_$v" "$out/mla_full_$v.json" >"$out/logs/bench_mla_full_$v.log" 2>&1
  echo "bench_sparse_mla_$v full rc=$? $(el)" >>"$tab"
done
if [ -n "${MOE_CASES:-}" ]; then
  DS_MOE_CASES="$MOE_CASES" timeout "${MOE_TIMEOUT:-150}" "$c/bench_moe" "$out/moe_persist.json" \
    >"$out/logs/bench_moe.log" 2>&1
  echo "bench_moe rc=$? $(el)" >>"$tab"
  grep -E "^(mxfp4|nvfp4) |expert GEMMs|^ceil" "$out/logs/bench_moe.log" >>"$tab"
fi
f="${MOE_TESTS-MoeCuda.Fp8DecodeFormsGiveTheSameBits:MoeCuda.Fp8PathVariants}"
if [ -n "$f" ]; then
  timeout 150 "$c/test_moe_cuda" --gtest_filter="$f" >"$out/logs/test_moe_cuda.log" 2>&1
  echo "test_moe_cuda rc=$? $(res "$out/logs/test_moe_cuda.log") $(el)" >>"$tab"
  grep -E '^\[  FAILED  \]|Failure' "$out/logs/test_moe_cuda.log" | head -12 >>"$tab"
fi
for tool in ${SANITIZERS-racecheck synccheck memcheck}; do
  timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 9 "$c/test_moe_cuda" \
    --gtest_filter="${SANITIZE_TEST:-MoeCuda.TinyUniformMxfp4}" >"$out/logs/moe_$tool.log" 2>&1
  echo "$tool moe rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$out/logs/moe_$tool.log" | tr '\n' ' ') $(el)" >>"$tab"
done
[ "${TESTS_OPS:-0}" = 1 ] && test_variants test_cuda_ops 150
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
cat "$tab"
