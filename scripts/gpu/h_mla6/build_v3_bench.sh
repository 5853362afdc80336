#!/usr/bin/env bash
# h-mla6: links a second sparse-MLA benchmark binary, bench_sparse_mla_v3, from an existing
# build dir's bench object and another version of the kernel source (v3, the version before v4:
# `git show 4133d48:src/kernels/cuda/attention/sparse_mla_decode.cu > sparse_mla_decode_v3.cu`
# on the dev machine, then carry it), so one device call can time both versions on the same GPU.
# The v3 object is placed before the libraries, so the linker never pulls the archive's
# (v4) sparse_mla_decode object. Another kernel source and binary suffix can be given:
#   scripts/gpu/h_mla6/build_v3_bench.sh BUILD_DIR KERNEL_SRC [SUFFIX]   (default suffix v3)
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
b="$(cd "$1" && pwd)"
src="$(realpath "$2")"
sfx="${3:-v3}"
cd "$b"
cc=$(ninja -t commands src/kernels/cuda/libds_kernels_cuda.a | grep -m1 "attention/sparse_mla_decode.cu.o")
cc=${cc/"$root/src/kernels/cuda/attention/sparse_mla_decode.cu"/"$src"}
cc=${cc/"-o src/kernels/cuda/CMakeFiles/ds_kernels_cuda.dir/attention/sparse_mla_decode.cu.o"/"-o sparse_mla_decode_$sfx.o"}
cc=$(echo "$cc" | sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//; s/^.*&& //')
eval "$cc"
ld=$(ninja -t commands bench/bench_sparse_mla | tail -1)
ld=${ld/" -o bench/bench_sparse_mla "/" sparse_mla_decode_$sfx.o -o bench/bench_sparse_mla_$sfx "}
eval "$ld"
ls -la "bench/bench_sparse_mla_$sfx"
