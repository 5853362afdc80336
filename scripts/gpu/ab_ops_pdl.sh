#!/usr/bin/env bash
# A/B of the op kernels' programmatic dependent launch (src/kernels/cuda/common/pdl.cuh) in one
# call: `deepserve profile --graphs` decode steps of a Flash-geometry prefix at B = 1, 16, 64,
# alternating DEEPSERVE_OPS_PDL=1 / 0 (two runs of each), then bench_ops with the attribute off
# (bench_ops with it on is run_merged_check.sh's). Binaries from scripts/gpu/pack_backend.sh.
#   scripts/gpu/ab_ops_pdl.sh OUT [LAYERS] [STEPS]
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: ab_ops_pdl.sh OUT [LAYERS] [STEPS]}"
layers="${2:-4}"
steps="${3:-40}"
carry=/tmp/carry_ab
rm -rf "$carry" && mkdir -p "$carry" "$out/logs"
xz -dc build/carry/backend.tar.xz | tar -C "$carry" -xf - || { echo "no carry"; exit 2; }
export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
export DEEPSERVE_CACHE_DIR=/dev/shm/deepserve-cache
model=/dev/shm/flash$layers
rm -rf "$model"
"$carry/deepserve" make-checkpoint --preset flash --layers "$layers" --out "$model" --no-verify \
  >"$out/logs/make_flash.log" 2>&1 || { echo "make-checkpoint failed"; exit 1; }
rows=()
for b in 1 16 64; do
  for round in 1 2; do
    for pdl in 1 0; do
      name="profile_flash${layers}_b${b}_pdl${pdl}_r${round}"
      DEEPSERVE_OPS_PDL=$pdl timeout 120 "$carry/deepserve" profile --device cuda --model "$model" \
        --batch "$b" --context 512 --steps "$steps" --warmup 5 --graphs \
        --output "$out/$name.json" >"$out/logs/$name.log" 2>&1
      rows+=("$(printf 'B=%-3s pdl=%s round %s rc=%s  %s' "$b" "$pdl" "$round" "$?" \
        "$(grep -E '^step' "$out/logs/$name.log" | head -1)")")
    done
  done
done
DEEPSERVE_OPS_PDL=0 timeout 150 "$carry/bench_ops" "$out/ops_nopdl.json" >"$out/logs/bench_ops_nopdl.log" 2>&1
echo "bench_ops (DEEPSERVE_OPS_PDL=0) rc=$?"
grep -E "^(rms_norm|rope_q|mhc_)" "$out/logs/bench_ops_nopdl.log" | head -18
tar -C "$out" -czf "$out/ab_logs.tgz" logs && rm -rf "$out/logs"
printf '%s\n' "${rows[@]}"
