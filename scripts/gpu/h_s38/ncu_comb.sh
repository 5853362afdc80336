#!/usr/bin/env bash
# Session 38: ncu --set full (clocks untouched, caches kept: the partials stay in L2 as in a real
# step) of one batch-1 combine launch (bench_sparse_mla "small", context 512: the 101st combine
# launch of the first case) for the tree's kernel and for each bench_sparse_mla_V variant named in
# NCU_VARIANTS: details, top SASS lines and regions (scripts/gpu/ncu_summary.sh) into OUT/ncu_V/
# (NCU_KEEP=0: into /tmp, printed only; OUT brings back at most 8 files).
#   NCU_VARIANTS="old" scripts/gpu/h_s38/ncu_comb.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: ncu_comb.sh OUT}"
[ "${NCU_KEEP:-1}" = 1 ] || out=/tmp/ncu_s38
c=/tmp/carry_s38n
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c" || exit 2
[ -f build/carry/variants.tar.xz ] && tar -C build/carry -xJf build/carry/variants.tar.xz
for v in tree ${NCU_VARIANTS:-}; do
  b="$c/bench_sparse_mla"
  [ "$v" = tree ] || b="build/carry/bench_sparse_mla_$v"
  mkdir -p "$out/ncu_$v"
  timeout 240 ncu --clock-control none --cache-control none --set full --import-source yes \
    --kernel-name regex:combine --launch-skip 100 --launch-count 1 -f -o "$out/ncu_$v/rep" \
    "$b" /tmp/ncu_bench.json small >"$out/ncu_$v/run.log" 2>&1
  echo "== $v: ncu rc=$?"
  scripts/gpu/ncu_summary.sh "$out/ncu_$v/rep.ncu-rep" "$out/ncu_$v" 25 2>&1 | head -60
  rm -f "$out/ncu_$v/source.csv"
done
