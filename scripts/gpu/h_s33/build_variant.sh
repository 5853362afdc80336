#!/usr/bin/env bash
# Session 33: binaries of build/full-cuda with sparse_mla_decode.cu rebuilt under extra defines,
# copied to build/carry/BIN_NAME (run after scripts/gpu/h_s29/pack.sh, which recreates build/carry).
#   scripts/gpu/h_s33/build_variant.sh NAME "-DDS_...=1 ..." [BIN ...]   (default BINs:
#   test_sparse_mla_cuda bench_sparse_mla); with SRC_REV=REV, sparse_mla_decode.cu as it is at git
#   revision REV (the rest of the tree as it is). With SRC=moe (session 43), moe.cu instead
#   (default BIN: bench_moe), e.g. the FP8 GEMMs' timing-only builds -DDS_MOE_F8_ABLATE=1.
set -euo pipefail
cd "$(dirname "$0")/../../.."
name="${1:?usage: build_variant.sh NAME DEFINES [BIN ...]}"
defs="${2:?usage: build_variant.sh NAME DEFINES [BIN ...]}"
shift 2
b=build/full-cuda
if [ "${SRC:-}" = moe ]; then
  bins="${*:-bench_moe}"
  obj=src/kernels/cuda/CMakeFiles/ds_kernels_cuda_moe.dir/moe/moe.cu.o
else
  bins="${*:-test_sparse_mla_cuda bench_sparse_mla}"
  obj=src/kernels/cuda/CMakeFiles/ds_kernels_cuda.dir/attention/sparse_mla_decode.cu.o
fi
cc=$(ninja -C $b -t commands $obj | tail -1)
if [ -n "${SRC_REV:-}" ]; then
  src=src/kernels/cuda/attention/sparse_mla_decode.cu
  tmp=src/kernels/cuda/attention/_variant_$name.cu  # beside it: the same relative includes
  trap 'rm -f "$tmp"' EXIT  # also when the compile fails
  git show "$SRC_REV:$src" >"$tmp"
  cc=${cc//$src/$tmp}
fi
(cd $b && eval "${cc/-o $obj/$defs -o /tmp/${SRC:-smla}_$name.o}")
for bin in $bins; do
  out=$(ninja -C $b -t targets all | sed -n "s|^\([^:]*/$bin\): .*|\1|p" | head -1)
  link=$(ninja -C $b -t commands "$out" | tail -1)
  (cd $b && eval "${link/-o $out/-o /tmp/${bin}_$name /tmp/${SRC:-smla}_$name.o}")
  strip "/tmp/${bin}_$name"
  cp "/tmp/${bin}_$name" build/carry/
done
ls -la build/carry
