#!/usr/bin/env bash
# Session 43: binaries of build/full-cuda with moe.cu rebuilt under extra defines, copied to
# build/carry/BIN_NAME (run after scripts/gpu/h_s29/pack.sh, which recreates build/carry; then
# scripts/gpu/h_s43/pack_moe_variants.sh). As scripts/gpu/h_s33/build_variant.sh for sparse MLA.
#   scripts/gpu/h_s43/build_moe_variant.sh NAME "-DDS_MOE_...=1 ..." [BIN ...]  (default: bench_moe)
set -euo pipefail
cd "$(dirname "$0")/../../.."
name="${1:?usage: build_moe_variant.sh NAME DEFINES [BIN ...]}"
defs="${2:?usage: build_moe_variant.sh NAME DEFINES [BIN ...]}"
shift 2
bins="${*:-bench_moe}"
b=build/full-cuda
obj=src/kernels/cuda/CMakeFiles/ds_kernels_cuda_moe.dir/moe/moe.cu.o
cc=$(ninja -C $b -t commands $obj | tail -1)
(cd $b && eval "${cc/-o $obj/$defs -o /tmp/moe_$name.o}")
for bin in $bins; do
  out=$(ninja -C $b -t targets all | sed -n "s|^\([^:]*/$bin\): .*|\1|p" | head -1)
  link=$(ninja -C $b -t commands "$out" | tail -1)
  (cd $b && eval "${link/-o $out/-o /tmp/${bin}_$name /tmp/moe_$name.o}")
  strip "/tmp/${bin}_$name"
  cp "/tmp/${bin}_$name" build/carry/
done
