#!/usr/bin/env bash
# h-idx7: builds (dev machine) the default binaries and every experiment variant, and fills the
# carry dir /work/main/build/h7-idx-carry (stripped) with them and run.sh. The experiment flags
# (DS_INDEXER_SCORE_MIN_BLOCKS, DS_INDEXER_PAGE_AHEAD, DS_IDX_EXP_*) exist in commit 758ddb3 only
# (removed after run 2; DS_INDEXER_F16_MMA=1 became the default): check that commit out to rebuild
# the run-2 binaries.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ninja -C build/k -j2 test_indexer_cuda bench_indexer
sv=scripts/gpu/h_idx7/build_variant.sh
# name : flags : --test for the candidates that could become the default
while IFS=: read -r name flags t; do
  bash "$sv" "$name" "$flags" $t | tail -1
done <<'LIST'
f16:-DDS_INDEXER_F16_MMA=1:--test
f16pa3:-DDS_INDEXER_F16_MMA=1 -DDS_INDEXER_PAGE_AHEAD=3:--test
pa3:-DDS_INDEXER_PAGE_AHEAD=3:--test
mb2:-DDS_INDEXER_SCORE_MIN_BLOCKS=2:
nopage:-DDS_IDX_EXP_NOPAGE=1:
noload:-DDS_IDX_EXP_NOLOAD=1:
nomma:-DDS_IDX_EXP_NOMMA=1:
noselect:-DDS_IDX_EXP_NOSELECT=1:
f16nopage:-DDS_INDEXER_F16_MMA=1 -DDS_IDX_EXP_NOPAGE=1:
f16noselect:-DDS_INDEXER_F16_MMA=1 -DDS_IDX_EXP_NOSELECT=1:
LIST
c=/work/main/build/h7-idx-carry
rm -rf "$c" && mkdir -p "$c/v"
cp build/k/tests/kernels/test_indexer_cuda build/k/bench/bench_indexer scripts/gpu/h_idx7/run.sh "$c/"
for d in build/k/variants/*/; do
  n=$(basename "$d")
  mkdir -p "$c/v/$n"
  cp "$d"/bench_indexer "$c/v/$n/"
  [ -f "$d/test_indexer_cuda" ] && cp "$d/test_indexer_cuda" "$c/v/$n/"
done
find "$c" -type f -name '*_indexer*' -exec strip {} +
du -sh "$c"
