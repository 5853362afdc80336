#!/usr/bin/env bash
# Session 36, call 1 (issue 6): the tree of b2dfe22 (evict-first KV copies) and the v9 variants
# measured on it: blk2 (per-block barriers, default since), backoff100 (the consumers' full wait
# sleeping 100 ns between polls; refuted and removed, so on a later tree its define does nothing),
# pp, and phase traces with the conversion units of the first two tiles. Then, on the device:
#   SANITIZE_VARIANTS="blk2 backoff100" scripts/gpu/h_s35/call.sh OUT
# (Since session 36 blk2 is the default: pp needs -DDS_SPARSE_MLA_WS_BLOCKBAR=0 on later trees.)
set -euo pipefail
B="-DDS_SPARSE_MLA_WS_BACKOFF=100"
T="|bench_sparse_mla"
exec "$(dirname "$0")/../mla_prepare.sh" \
  "blk2|-DDS_SPARSE_MLA_WS_BLOCKBAR=2" "backoff100|$B" "pp|-DDS_SPARSE_MLA_WS_PINGPONG=1$T" \
  "trace128|-DDS_SPARSE_MLA_WS_TRACE=128$T" "trace16|-DDS_SPARSE_MLA_WS_TRACE=16$T" \
  "trace128backoff100|-DDS_SPARSE_MLA_WS_TRACE=128 $B$T" \
  "trace16backoff100|-DDS_SPARSE_MLA_WS_TRACE=16 $B$T" \
  "trace128blk2|-DDS_SPARSE_MLA_WS_TRACE=128 -DDS_SPARSE_MLA_WS_BLOCKBAR=2$T"
