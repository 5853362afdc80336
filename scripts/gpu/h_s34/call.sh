#!/usr/bin/env bash
# Session 34: scripts/gpu/h_s33/call.sh with the variant binaries packed into
# build/carry/variants.tar.xz (scripts/gpu/h_s34/pack_variants.sh), so that more of them fit the
# 64 MiB a call carries.   scripts/gpu/h_s34/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: call.sh OUT}"
[ -f build/carry/variants.tar.xz ] && tar -C build/carry -xJf build/carry/variants.tar.xz
# compute-sanitizer of the variant tests named in SANITIZE_VARIANTS (e.g. "blk1 blk2"), first
# (call.sh packs OUT/logs at its end); their lines go to OUT/logs/extra.txt and are printed first
# (OUT keeps at most 8 files: mla.json, 4 variant JSONs, table, summary, logs.tgz).
mkdir -p "$out/logs"
if [ -n "${SANITIZE_VARIANTS:-}" ]; then  # the libraries of the variant binaries
  . scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz /tmp/carry_s34 || exit 2
fi
for v in ${SANITIZE_VARIANTS:-}; do
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 build/carry/test_sparse_mla_cuda_$v \
      --gtest_filter="SparseMlaCuda.FlashSpeculativeBatch4:SparseMlaCuda.FlashShortLengthsAndMasks" \
      >"$out/logs/${tool}_$v.log" 2>&1
    echo "$v $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/logs/${tool}_$v.log" | tr '\n' ' ')" \
      >>"$out/logs/extra.txt"
  done
done
[ -f "$out/logs/extra.txt" ] && cat "$out/logs/extra.txt"
bash scripts/gpu/h_s33/call.sh "$@"
