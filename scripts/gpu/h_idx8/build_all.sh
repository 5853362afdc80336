#!/usr/bin/env bash
# h-idx8 (issue 7, session 8): builds (dev machine, Release sm_90a) the default binaries (wgmma
# score path) and the comparison variants, and fills the carry dir /work/main/build/h8-idx-carry
# (stripped) with them and run.sh. Variants (build-time -D flags of indexer.cu, NOTES.md):
#   mma  DS_INDEXER_WGMMA=0: the session-7 default (mma.sync f16 score loop), same run baseline
#   c4k  DS_INDEXER_CHUNK=4096: half as many chunk selects
#   s3   DS_INDEXER_WG_STAGES=3 (bench only)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ninja -C build/k -j2 test_indexer_cuda bench_indexer
sv=scripts/gpu/h_idx8/build_variant.sh
while IFS=: read -r name flags t; do
  bash "$sv" "$name" "$flags" $t | tail -1
done <<'LIST'
mma:-DDS_INDEXER_WGMMA=0:--test
c4k:-DDS_INDEXER_CHUNK=4096:--test
s3:-DDS_INDEXER_WG_STAGES=3:
LIST
c=/work/main/build/h8-idx-carry
rm -rf "$c" && mkdir -p "$c/v"
cp build/k/tests/kernels/test_indexer_cuda build/k/bench/bench_indexer scripts/gpu/h_idx8/run.sh "$c/"
for n in mma c4k s3; do
  d=build/k/variants/$n
  mkdir -p "$c/v/$n"
  cp "$d"/bench_indexer "$c/v/$n/"
  [ -f "$d/test_indexer_cuda" ] && cp "$d/test_indexer_cuda" "$c/v/$n/"
done
find "$c" -type f -name '*_indexer*' -exec strip {} +
du -sh "$c"
