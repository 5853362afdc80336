#!/usr/bin/env bash
# A/B of an environment switch of the CUDA backend in one call (DEEPSERVE_OPS_PDL: the op
# kernels' programmatic dependent launch; DEEPSERVE_MHC_FUSED: mhc_pre's one-launch decode path;
# DEEPSERVE_TILED_FP8 ...): `deepserve profile --graphs` decode steps of a Flash-geometry prefix at
# B = 1, 16, 64, alternating VAR=1 / VAR=0 (two runs of each), then, with PRE (a command run
# first, e.g. the GPU tests) and BENCH_OPS=1, bench_ops with VAR=0 next to the default's.
# Binaries from scripts/gpu/pack_backend.sh. The profiles' JSON go into OUT/ab_VAR.tgz.
#   scripts/gpu/ab_switch.sh OUT VAR [LAYERS] [STEPS]
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: ab_switch.sh OUT VAR [LAYERS] [STEPS]}"
var="${2:?usage: ab_switch.sh OUT VAR [LAYERS] [STEPS]}"
layers="${3:-4}"
steps="${4:-40}"
carry=/tmp/carry_ab
mkdir -p "$out/logs" "$out/ab"
. scripts/gpu/unpack_bins.sh
unpack_bins build/carry/backend.tar.xz "$carry" || { echo "no carry"; exit 2; }
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
export DEEPSERVE_CACHE_DIR=/dev/shm/deepserve-cache
model=/dev/shm/flash$layers
rm -rf "$model"
"$carry/deepserve" make-checkpoint --preset flash --layers "$layers" --out "$model" --no-verify \
  >"$out/logs/make_flash.log" 2>&1 || { echo "make-checkpoint failed"; exit 1; }
rows=()
for b in 1 16 64; do
  for round in 1 2; do
    for v in 1 0; do
      name="profile_flash${layers}_b${b}_${var}${v}_r${round}"
      env "$var=$v" timeout 120 "$carry/deepserve" profile --device cuda --model "$model" \
        --batch "$b" --context 512 --steps "$steps" --warmup 5 --graphs \
        --output "$out/ab/$name.json" >"$out/logs/$name.log" 2>&1
      rows+=("$(printf 'B=%-3s %s=%s round %s rc=%s  %s' "$b" "$var" "$v" "$round" "$?" \
        "$(grep -E '^step' "$out/logs/$name.log" | head -1)")")
    done
  done
done
if [ "${BENCH_OPS:-0}" = 1 ]; then
  env "$var=0" timeout 150 "$carry/bench_ops" "$out/ab/ops_${var}0.json" \
    >"$out/logs/bench_ops_${var}0.log" 2>&1
  echo "bench_ops ($var=0) rc=$?"
  grep -E "^(rms_norm|rope_q|mhc_)" "$out/logs/bench_ops_${var}0.log" | head -24
fi
tar -C "$out" -czf "$out/ab_${var}.tgz" logs ab && rm -rf "$out/logs" "$out/ab"
printf '%s\n' "${rows[@]}"
