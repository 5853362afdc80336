#!/usr/bin/env bash
# h-mla7: links a benchmark and a test binary against another version of the sparse-MLA kernel
# source (the h_mla6/build_v3_bench.sh pattern, plus the test and extra compiler flags):
#   scripts/gpu/h_mla7/build_variant.sh BUILD_DIR KERNEL_SRC SUFFIX [EXTRA_NVCC_FLAGS]
# -> BUILD_DIR/bench/bench_sparse_mla_SUFFIX, BUILD_DIR/tests/kernels/test_sparse_mla_cuda_SUFFIX.
# The variant object is placed before the libraries, so the linker never pulls the archive's
# sparse_mla_decode object.
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
b="$(cd "$1" && pwd)"
src="$(realpath "$2")"
sfx="$3"
extra="${4:-}"
cd "$b"
cc=$(ninja -t commands src/kernels/cuda/libds_kernels_cuda.a | grep -m1 "attention/sparse_mla_decode.cu.o")
cc=${cc/"$root/src/kernels/cuda/attention/sparse_mla_decode.cu"/"$src"}
cc=${cc/"-o src/kernels/cuda/CMakeFiles/ds_kernels_cuda.dir/attention/sparse_mla_decode.cu.o"/"$extra -o sparse_mla_decode_$sfx.o"}
cc=$(echo "$cc" | sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//; s/^.*&& //')
(cd "$b" && eval "$cc")
ld=$(ninja -t commands bench/bench_sparse_mla | tail -1)
ld=${ld/" -o bench/bench_sparse_mla "/" sparse_mla_decode_$sfx.o -o bench/bench_sparse_mla_$sfx "}
(cd "$b" && eval "$ld")
ld=$(ninja -t commands tests/kernels/test_sparse_mla_cuda | tail -1)
ld=${ld/" -o tests/kernels/test_sparse_mla_cuda "/" sparse_mla_decode_$sfx.o -o tests/kernels/test_sparse_mla_cuda_$sfx "}
(cd "$b" && eval "$ld")
ls -la "bench/bench_sparse_mla_$sfx" "tests/kernels/test_sparse_mla_cuda_$sfx"
