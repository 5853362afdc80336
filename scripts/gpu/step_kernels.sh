#!/usr/bin/env bash
# Which kernels a Flash 4-layer decode step runs and how long each takes on its own (session 28):
# ncu gpu__time_duration of every kernel node of `deepserve profile --graphs` (2 steps after 1
# warm-up; ncu flushes the caches before each kernel, so a small kernel reads ~3 us at least), at
# context 512 for the batches in KB (default "1 64"), next to the graph step time without ncu.
# step_kernels_summary.py prints the last step's kernels in order, then grouped by name. With
# OPS=1 (default) bench_ops runs after. Everything lands in OUT/kernels.tgz (+ OUT/ops.json).
# Binaries: build/carry/backend.tar.xz (deepserve, bench_ops and libraries; unpack_bins.sh).
#   scripts/gpu/step_kernels.sh OUT
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: step_kernels.sh OUT}"
c=/tmp/carry_k
mkdir -p "$out/k"
. scripts/gpu/unpack_bins.sh && unpack_bins build/carry/backend.tar.xz "$c"
export DEEPSERVE_CACHE_DIR=/dev/shm/deepserve-cache
model=/dev/shm/flash4
[ -d "$model" ] || "$c/deepserve" make-checkpoint --preset flash --layers 4 --out "$model" \
  --no-verify >"$out/k/make_flash.log" 2>&1 || { echo "make-checkpoint failed"; exit 1; }
for b in ${KB:-1 64}; do
  timeout 120 "$c/deepserve" profile --device cuda --model "$model" --batch "$b" --context 512 \
    --steps 40 --warmup 5 --graphs --output "$out/k/step_b$b.json" >"$out/k/step_b$b.log" 2>&1
  echo "B=$b graph step: $(grep -E '^step' "$out/k/step_b$b.log" | head -1)"
  timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$c/deepserve" profile --device cuda --model "$model" --batch "$b" --context 512 \
    --steps 2 --warmup 1 --graphs --output "$out/k/ncu_step_b$b.json" \
    >"$out/k/ncu_b$b.csv" 2>"$out/k/ncu_b$b.err"
  echo "B=$b ncu rc=$? rows $(wc -l <"$out/k/ncu_b$b.csv")"
  python3 scripts/gpu/step_kernels_summary.py "$out/k/ncu_b$b.csv" >"$out/k/summary_b$b.txt" 2>&1
done
tar -C "$out" -czf "$out/kernels.tgz" k
[ -n "${OPS:-1}" ] && timeout 200 "$c/bench_ops" "$out/ops.json" >"$out/ops.log" 2>&1; echo "bench_ops rc=$?"
for b in ${KB:-1 64}; do echo "=== B=$b"; cat "$out/k/summary_b$b.txt"; done
