#!/usr/bin/env bash
# h-idx8 (issue 7, session 8): builds (dev machine, Release sm_90a) the default binaries (wgmma
# score path) and the comparison variants, and fills the carry dir /work/main/build/h8-idx-carry
# (stripped) with them and run.sh. Variants (build-time -D flags of indexer.cu, NOTES.md):
#   mma       DS_INDEXER_WGMMA=0: the mma.sync f16 score loop (what other archs run), tested
#   c4k       DS_INDEXER_CHUNK=4096: half as many chunk selects, tested
#   nobucket  DS_INDEXER_SELECT_BUCKETS=0: selects always over the maximum rows (bench only)
# Run 1 (commit 7828e11) used mma / c4k / s3; run 2 (commit 940da90) mma / c4k / uncoal
# (DS_INDEXER_WG_COALESCED=0, a flag removed after it) / nobucket (then broken: see
# results/run2/README.txt) / s5 (DS_INDEXER_WG_STAGES=5).
set -euo pipefail
cd "$(dirname "$0")/../../.."
ninja -C build/k -j2 test_indexer_cuda bench_indexer
sv=scripts/gpu/h_idx8/build_variant.sh
while IFS=: read -r name flags t; do
  bash "$sv" "$name" "$flags" $t | tail -1
done <<'LIST'
mma:-DDS_INDEXER_WGMMA=0:--test
c4k:-DDS_INDEXER_CHUNK=4096:--test
nobucket:-DDS_INDEXER_SELECT_BUCKETS=0:
LIST
c=/work/main/build/h8-idx-carry
rm -rf "$c" && mkdir -p "$c/v"
cp build/k/tests/kernels/test_indexer_cuda build/k/bench/bench_indexer scripts/gpu/h_idx8/run.sh "$c/"
for n in mma c4k nobucket; do
  d=build/k/variants/$n
  mkdir -p "$c/v/$n"
  cp "$d"/bench_indexer "$c/v/$n/"
  [ -f "$d/test_indexer_cuda" ] && cp "$d/test_indexer_cuda" "$c/v/$n/"
done
find "$c" -type f -name '*_indexer*' -exec strip {} +
du -sh "$c"
