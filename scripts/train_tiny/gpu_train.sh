#!/bin/bash
# The one device run: train on the carried token files, write weights + loss JSON under $OUT.
# Usage (device, repo root): bash scripts/train_tiny/gpu_train.sh DATA_DIR TIME_BUDGET_S
# bf16 autocast first; if that run fails, an fp32 run with a shorter budget. Returns 7 files
# (3 weight shards of <= 15 MiB, loss.json, config.json, gpu.txt, train.log): within the
# device limits of 8 files / 16 MiB each / 64 MiB. Run 1 (230 s) overfit after ~600 steps.
set -u
DATA=${1:-out/h-train-data}
BUDGET=${2:-120}
mkdir -p "$OUT"
T0=$(date +%s)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())" >> "$OUT/gpu.txt" 2>&1
python3 scripts/train_tiny/train.py --data "$DATA" --out "$OUT" --device cuda --bf16 \
  --batch 32 --seq-len 256 --time-budget "$BUDGET" --dropout "${DROPOUT:-0.1}" --eval-every 100 --eval-seqs 64 \
  > "$OUT/train.log" 2>&1
RC=$?
if [ $RC -ne 0 ]; then
  LEFT=$(( 330 - ($(date +%s) - T0) ))
  [ $LEFT -lt 60 ] && LEFT=60
  echo "bf16 run failed (rc $RC); fp32 run with budget $LEFT" >> "$OUT/gpu.txt"
  mv "$OUT/train.log" "$OUT/train_bf16_failed.log"
  python3 scripts/train_tiny/train.py --data "$DATA" --out "$OUT" --device cuda \
    --batch 32 --seq-len 256 --time-budget "$LEFT" --dropout "${DROPOUT:-0.1}" --eval-every 100 --eval-seqs 64 \
    > "$OUT/train.log" 2>&1
fi
cat "$OUT/gpu.txt"; tail -c 5000 "$OUT/train.log"
