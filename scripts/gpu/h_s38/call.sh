#!/usr/bin/env bash
# Session 38 (issue 6, batch 1): binaries from scripts/gpu/mla_prepare.sh in build/carry.
#   0. TESTS=1: test_sparse_mla_cuda, SANITIZE="memcheck racecheck" on SANITIZE_FILTER (of the
#      tree's test binary, or of test_sparse_mla_cuda_V with SANITIZE_VARIANT=V),
#      TESTS_OPS=1: test_cuda_ops;
#   1. the tree's bench_sparse_mla in "small" mode (batch 1 and 4, both contexts, with the split
#      sweeps) ROUNDS times -> OUT/mla_small.json (+ logs), TESTS=1: test_sparse_mla_cuda first;
#   2. each variant bench_sparse_mla_V in "small" mode -> OUT/mla_small_V.json; a variant named
#      trace*: DS_MLA_TRACE_OUT dump summarized by trace_b1.py into OUT/trace_V.txt;
#   3. the variant tests (test_sparse_mla_cuda_V, test_cuda_ops_V) found in build/carry;
#      FULL_VARIANT=V: bench_sparse_mla_V's full run -> OUT/mla_full_V.json; FULL_TREE=1: the
#      tree's bench_sparse_mla full run -> OUT/mla_full_tree.json;
#   4. table of the batch-1 / batch-4 rows (h_s32/summary.py) -> OUT/table.txt.
#   scripts/gpu/h_s38/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call.sh OUT}"
c=/tmp/carry_s38
mkdir -p "$out/logs"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
[ -f build/carry/variants.tar.xz ] && tar -C build/carry -xJf build/carry/variants.tar.xz
export DS_COMMIT="$(tr '\n' ' ' <build/carry/COMMIT)"
echo "gpu: $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader) commit $DS_COMMIT" >"$out/table.txt"
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
res() { grep -E '^\[  (PASSED|FAILED) ' "$1" | tr '\n' ' '; }
rows() { python3 scripts/gpu/h_s38/small.py "$1" 2>&1; }
if [ "${TESTS:-0}" = 1 ]; then
  timeout 300 "$c/test_sparse_mla_cuda" >"$out/logs/test.log" 2>&1
  echo "test_sparse_mla_cuda rc=$? $(res "$out/logs/test.log") $(el)" >>"$out/table.txt"
  grep -E '^\[  FAILED  \]|Failure' "$out/logs/test.log" | head -20 >>"$out/table.txt"
  sb="$c/test_sparse_mla_cuda"
  [ -z "${SANITIZE_VARIANT:-}" ] || sb="build/carry/test_sparse_mla_cuda_$SANITIZE_VARIANT"
  for tool in ${SANITIZE:-}; do  # e.g. SANITIZE="memcheck racecheck"
    timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 "$sb" \
      --gtest_filter="${SANITIZE_FILTER:-SparseMlaCuda.TinyShapes:SparseMlaCuda.FlashBatch1}" \
      >"$out/logs/$tool.log" 2>&1
    echo "$tool ${SANITIZE_VARIANT:-tree} rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/logs/$tool.log" | tr '\n' ' ') $(el)" >>"$out/table.txt"
  done
fi
if [ "${TESTS_OPS:-0}" = 1 ]; then
  timeout 300 "$c/test_cuda_ops" >"$out/logs/test_cuda_ops.log" 2>&1
  echo "test_cuda_ops rc=$? $(res "$out/logs/test_cuda_ops.log") $(el)" >>"$out/table.txt"
fi
for r in $(seq 1 "${ROUNDS:-1}"); do
  timeout 120 "$c/bench_sparse_mla" "$out/logs/mla_small_r$r.json" small >"$out/logs/bench_r$r.log" 2>&1
  echo "== tree, round $r: rc=$? $(el)" >>"$out/table.txt"
  rows "$out/logs/mla_small_r$r.json" >>"$out/table.txt"
  for b in build/carry/bench_sparse_mla_*; do
    [ -x "$b" ] || continue
    v=${b##*/bench_sparse_mla_}
    rm -f "/tmp/trace_$v.txt"
    DS_MLA_TRACE_OUT="/tmp/trace_$v.txt" timeout 120 "$b" "$out/logs/mla_small_${v}_r$r.json" small \
      >"$out/logs/bench_${v}_r$r.log" 2>&1
    echo "== variant $v, round $r: rc=$? $(el)" >>"$out/table.txt"
    rows "$out/logs/mla_small_${v}_r$r.json" >>"$out/table.txt"
    if [ -f "/tmp/trace_$v.txt" ]; then
      python3 scripts/gpu/h_s38/trace_b1.py "/tmp/trace_$v.txt" >"$out/trace_${v}_r$r.txt" 2>&1
      xz -c "/tmp/trace_$v.txt" >"$out/logs/trace_${v}_r$r.txt.xz"
    fi
  done
done
for v in ${QUICK_VARIANTS:-}; do  # "quick" mode (batch 1-128 at 32K): the tree, then each V
  [ -f "$out/logs/mla_quick_tree.json" ] ||
    timeout 120 "$c/bench_sparse_mla" "$out/logs/mla_quick_tree.json" quick >/dev/null 2>&1
  timeout 120 "build/carry/bench_sparse_mla_$v" "$out/logs/mla_quick_$v.json" quick >/dev/null 2>&1
  { echo "== quick: tree, then $v"; python3 scripts/gpu/h_s38/small.py "$out/logs/mla_quick_tree.json";
    python3 scripts/gpu/h_s38/small.py "$out/logs/mla_quick_$v.json"; } >>"$out/table.txt" 2>&1
done
for tb in build/carry/test_sparse_mla_cuda_* build/carry/test_cuda_ops_*; do
  [ -x "$tb" ] || continue
  t=${tb##*/}
  timeout 300 "$tb" >"$out/logs/$t.log" 2>&1
  echo "$t rc=$? $(res "$out/logs/$t.log") $(el)" >>"$out/table.txt"
done
if [ -n "${FULL_VARIANT:-}" ]; then
  timeout 300 "build/carry/bench_sparse_mla_$FULL_VARIANT" "$out/mla_full_$FULL_VARIANT.json" \
    >"$out/logs/bench_full_$FULL_VARIANT.log" 2>&1
  echo "full bench $FULL_VARIANT rc=$? $(el)" >>"$out/table.txt"
fi
if [ "${FULL_TREE:-0}" = 1 ]; then
  timeout 300 "$c/bench_sparse_mla" "$out/mla_full_tree.json" >"$out/logs/bench_full_tree.log" 2>&1
  echo "full bench tree rc=$? $(el)" >>"$out/table.txt"
fi
cp "$out/logs/mla_small_r1.json" "$out/mla_small.json" 2>/dev/null
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
cat "$out"/trace_*_r1.txt 2>/dev/null | head -80
cat "$out/table.txt"
