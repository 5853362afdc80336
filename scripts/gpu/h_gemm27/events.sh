#!/usr/bin/env bash
# Session 27: event-timed decode components (deepserve profile --graphs --event-timing) of a
# Flash 4-layer checkpoint at context 512, B in EV_BATCHES (default 1 16), with
# DEEPSERVE_GEMM_WGMMA=1 / =0 alternating, two rounds; the attention projections component is
# where kWgmma runs (wq_b, wo_b, wo_a).
# Binaries: build/carry/backend.tar.xz (deepserve + its shared libraries).
#   scripts/gpu/h_gemm27/events.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${1:?usage: events.sh OUT}"
c=/tmp/carry_ev
mkdir -p "$out/ev"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c"
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
export DEEPSERVE_CACHE_DIR=/dev/shm/deepserve-cache
model=/dev/shm/flash4
[ -d "$model" ] || "$c/deepserve" make-checkpoint --preset flash --layers 4 --out "$model" \
  --no-verify >"$out/ev/make_flash.log" 2>&1 || { echo "make-checkpoint failed"; exit 1; }
for b in ${EV_BATCHES:-1 16}; do
  for round in 1 2; do
    for v in 1 0; do
      name="profile_flash4_b${b}_c512_events_wgmma${v}_r${round}"
      DEEPSERVE_GEMM_WGMMA=$v timeout 120 "$c/deepserve" profile --device cuda --model "$model" \
        --batch "$b" --context 512 --steps 40 --warmup 5 --graphs --event-timing \
        --output "$out/ev/$name.json" >"$out/ev/$name.log" 2>&1
      echo "B=$b wgmma=$v round $round rc=$? $(grep -E '^step' "$out/ev/$name.log" | head -1)"
      grep -E "attention proj|^ *moe|sparse att" "$out/ev/$name.log" | head -3
    done
  done
done
tar -C "$out" -czf "$out/events.tgz" ev && rm -rf "$out/ev"
