#!/usr/bin/env bash
# Session 34: scripts/gpu/h_s33/call.sh with the variant binaries packed into
# build/carry/variants.tar.xz (scripts/gpu/h_s34/pack_variants.sh), so that more of them fit the
# 64 MiB a call carries.   scripts/gpu/h_s34/call.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
[ -f build/carry/variants.tar.xz ] && tar -C build/carry -xJf build/carry/variants.tar.xz
exec bash scripts/gpu/h_s33/call.sh "$@"
