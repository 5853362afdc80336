#!/usr/bin/env bash
# Builds the microbench variants into build/h_samp17 (sm_90a), one binary per name=flags pair,
# flags separated by ':' (default: the call-4 sweep of block size, load batch and mass atomics).
# Call 3's ablations (-DDS_SAMPLE_ROWS_ABLATE=1|2, first pass without masses / histogram) were
# not kept in the kernel (never committed).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=build/h_samp17 && rm -rf "$out" && mkdir -p "$out"
variants=("$@")
if [ $# -eq 0 ]; then
  variants=(t1024b8= t512b8=-DDS_SAMPLE_ROWS_THREADS=512
            t512b16=-DDS_SAMPLE_ROWS_THREADS=512:-DDS_SAMPLE_ROWS_BATCH=16
            t1024b4=-DDS_SAMPLE_ROWS_BATCH=4
            t512b8u64=-DDS_SAMPLE_ROWS_THREADS=512:-DDS_SAMPLE_ROWS_MASS_DIGITS=0)
fi
for v in "${variants[@]}"; do
  name="${v%%=*}"; flags="${v#*=}"
  # shellcheck disable=SC2086
  nvcc -std=c++20 -O2 --expt-relaxed-constexpr -Isrc -Iinclude -gencode arch=compute_90a,code=sm_90a \
    -cudart static ${flags//:/ } scripts/gpu/h_samp17/microbench.cu -o "$out/mb_$name" &
done
wait
ls "$out"
