#!/usr/bin/env bash
# v7 (sm_90a sparse MLA) diagnosis: the tree's bench_sparse_mla and its ablation builds
# (build/carry/bench_sparse_mla_abN, scripts/gpu/h_mla16/build_variants.sh) in quick mode, then an
# ncu profile of the wgmma kernel's first launch in FlashBatch128 (B = 128, one split) with
# SASS-level stall samples (sass_top.py).
#   OUT=... bash scripts/gpu/h_mla16/profile.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-/tmp/h_mla16}"; mkdir -p "$out"
c=/tmp/carry_mla16
rm -rf "$c" && mkdir -p "$c" && xz -dc build/carry/backend.tar.xz | tar -C "$c" -xf -
export LD_LIBRARY_PATH="$c/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
S="$out/summary.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> "$S"
cp "$c/bench_sparse_mla" /tmp/bench_sparse_mla_ab0
for b in /tmp/bench_sparse_mla_ab0 build/carry/bench_sparse_mla_ab*; do
  [ -x "$b" ] || continue
  v="${b##*_ab}"
  timeout 120 "$b" "/tmp/ab$v.json" quick > "/tmp/ab$v.log" 2>&1
  [ "$v" = 0 ] && cp /tmp/ab0.json "$out/sparse_mla_decode_quick.json"
  echo "ablate $v rc=$?" >> "$S"
  grep -E " graph " "/tmp/ab$v.log" | grep -E "wgmma|h64 p1 graph|h16 p1 graph|h32 p1 graph" | grep -v _pdl \
    | awk '{printf "  %s %s %s %s %s\n", $1, $2, $5, $9, $10}' >> "$S"
done
for t in build/carry/test_sparse_mla_cuda_ab*; do
  [ -x "$t" ] || continue
  timeout 200 "$t" > "/tmp/${t##*/}.log" 2>&1
  echo "${t##*/}: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' /tmp/${t##*/}.log | tr '\n' ' ')" >> "$S"
  grep -E "^\[  FAILED" "/tmp/${t##*/}.log" >> "$S"
done
[ "${NCU:-1}" = 1 ] || { cat "$S"; exit 0; }
timeout 240 ncu --clock-control none --kernel-name regex:wgmma_kernel --launch-count 1 --set full \
  --import-source yes -f -o /tmp/prof "$c/test_sparse_mla_cuda" \
  --gtest_filter=SparseMlaCuda.FlashBatch128 > /tmp/ncu.log 2>&1
echo "ncu rc=$?" >> "$S"
ncu -i /tmp/prof.ncu-rep --page details > "$out/prof_details.txt" 2>&1
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source=sass > /tmp/prof_sass.csv 2>&1
python3 scripts/gpu/h_mla16/sass_top.py /tmp/prof_sass.csv 40 > "$out/sass_top.txt" 2>&1
grep -E "Duration|Issue Slots Busy|Eligible Warps|No Eligible|DRAM Throughput|Bank|Stall|stall" "$out/prof_details.txt" | head -24 >> "$S"
cat "$S" "$out/sass_top.txt"
