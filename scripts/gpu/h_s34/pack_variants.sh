#!/usr/bin/env bash
# Session 34: moves the variant binaries of build/carry (scripts/gpu/h_s33/build_variant.sh) into
# build/carry/variants.tar.xz, unpacked again by scripts/gpu/h_s34/call.sh on the GPU machine
# (bench_moe_V too since session 43: scripts/gpu/h_s43/call.sh).
set -euo pipefail
cd "$(dirname "$0")/../../../build/carry"
v=$(ls | grep -E '^((test|bench)_sparse_mla(_cuda)?|test_cuda_ops|bench_moe)_' || true)
[ -n "$v" ] || exit 0
# shellcheck disable=SC2086
tar -cf - $v | xz -T2 -9 >variants.tar.xz && rm -f $v
ls -la
