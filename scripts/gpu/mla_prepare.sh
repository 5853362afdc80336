#!/usr/bin/env bash
# The binaries of one sparse MLA device call (issue 6): the tree's test_sparse_mla_cuda,
# bench_sparse_mla and test_cuda_ops (build/full-cuda, sm_90a) packed into build/carry
# (scripts/gpu/h_s29/pack.sh), then each variant "NAME|DEFINES[|BIN ...[|REV]]" (REV: the kernel
# file sparse_mla_decode.cu as at git revision REV; BINs may be empty) rebuilt with its extra
# defines (scripts/gpu/h_s33/build_variant.sh; default BINs: the test and the bench), two at a
# time, and xz-packed (scripts/gpu/h_s34/pack_variants.sh). Replaces the per-call prepare.sh of
# sessions 35-36. On the device: SANITIZE_VARIANTS="..." scripts/gpu/h_s35/call.sh OUT
#   scripts/gpu/mla_prepare.sh "unroll1|-DDS_SPARSE_MLA_WS_UNITLOOP=1" \
#     "trace128|-DDS_SPARSE_MLA_WS_TRACE=128|bench_sparse_mla" ...
set -euo pipefail
cd "$(dirname "$0")/../.."
ninja -C build/full-cuda test_sparse_mla_cuda bench_sparse_mla test_cuda_ops
scripts/gpu/h_s29/pack.sh build/full-cuda test_sparse_mla_cuda bench_sparse_mla test_cuda_ops
rm -f /tmp/variant_*.err
build() {  # one lane: the specs given, in order
  for spec in "$@"; do
    IFS='|' read -r name defs bins rev <<<"$spec"
    # shellcheck disable=SC2086
    SRC_REV="$rev" scripts/gpu/h_s33/build_variant.sh "$name" "$defs" $bins >/dev/null \
      2>"/tmp/variant_$name.err" ||
      echo "variant $name FAILED"
  done
}
lane0=() lane1=()
i=0
for spec in "$@"; do
  if ((i++ % 2 == 0)); then lane0+=("$spec"); else lane1+=("$spec"); fi
done
build "${lane0[@]}" &
build "${lane1[@]}" &
wait
cat /tmp/variant_*.err 2>/dev/null | grep -v C7519 || true  # messages other than the known C7519
scripts/gpu/h_s34/pack_variants.sh
du -sh build/carry
