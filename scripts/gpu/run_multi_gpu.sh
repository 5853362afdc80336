#!/usr/bin/env bash
# Tensor/expert parallelism on the GPU machine (docs/parallelism.md): runs test_cuda_sharded (NCCL
# all-reduce on every visible GPU, the tiny model sharded over min(2, GPUs) NCCL ranks and over
# two host-linked ranks) from the binary that scripts/gpu/pack_backend.sh carries, after finding
# libnccl.so.2 there (deepserve loads NCCL at run time: DEEPSERVE_NCCL_LIBRARY).
#
#   scripts/gpu/run_multi_gpu.sh [OUT_DIR] [--binary PATH] [--timeout SECONDS]
# OUT_DIR (default $OUT, else bench/results) receives test_cuda_sharded.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-bench/results}}"
shift || true
binary=""
limit=300  # an NCCL rank left waiting would hang the test: cut it off
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift ;;
    --timeout) limit="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"

# The binary: given, carried loose, or inside pack_backend.sh's archive.
if [ -z "$binary" ]; then
  if [ -x build/carry/test_cuda_sharded ]; then
    binary=build/carry/test_cuda_sharded
    export LD_LIBRARY_PATH="$(pwd)/build/carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  elif [ -f build/carry/backend.tar.xz ]; then
    carry=/tmp/carry
    if [ ! -x "$carry/test_cuda_sharded" ]; then
      rm -rf "$carry"; mkdir -p "$carry"
      xz -dc build/carry/backend.tar.xz | tar -C "$carry" -xf -
    fi
    binary="$carry/test_cuda_sharded"
    export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
if [ -z "$binary" ] || [ ! -x "$binary" ]; then
  echo "test_cuda_sharded not found (pack it with scripts/gpu/pack_backend.sh or pass --binary)" >&2
  exit 2
fi

# NCCL: finds libnccl.so.2 (DEEPSERVE_NCCL_LIBRARY), sets NCCL_NVLS_ENABLE=0; sets $nccl.
source scripts/gpu/nccl_env.sh

nvidia-smi -L
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${gpus:-0}" -gt 1 ]; then nvidia-smi topo -m; fi

t0=$(date +%s)
timeout "$limit" "$binary" >"$out/test_cuda_sharded.log" 2>&1
rc=$?
grep -E "^\[ +(PASSED|FAILED|SKIPPED|OK) |\[ metric \]|Failure|Expected|Which is|NCCL WARN" \
  "$out/test_cuda_sharded.log" | head -60
[ $rc -eq 124 ] && echo "test_cuda_sharded: timed out after ${limit}s (a rank waiting in NCCL?)"
printf '%-24s rc=%-3s %4ss  (%s GPUs, NCCL %s)\n' test_cuda_sharded "$rc" \
  "$(( $(date +%s) - t0 ))" "${gpus:-0}" "${nccl:-none}"
exit $rc
