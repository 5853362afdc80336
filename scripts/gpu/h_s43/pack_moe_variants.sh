#!/usr/bin/env bash
# Session 43: moves the MoE variant binaries of build/carry (scripts/gpu/h_s43/build_moe_variant.sh)
# into build/carry/moe_variants.tar.xz, unpacked again by scripts/gpu/h_s43/call.sh.
set -euo pipefail
cd "$(dirname "$0")/../../../build/carry"
v=$(ls | grep -E '^bench_moe_' || true)
[ -n "$v" ] || exit 0
# shellcheck disable=SC2086
tar -cf - $v | xz -T2 -9 >moe_variants.tar.xz && rm -f $v
ls -la
