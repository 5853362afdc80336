#!/bin/bash
# Step 5/6 after a training run: master shards -> published checkpoint (our make-checkpoint
# --from) -> held-out perplexity + MTP acceptance on deepserve's CPU backend vs the training
# script's number on the same sequences -> compact artifact -> re-expanded checkpoint -> the same
# numbers again -> greedy continuations of two prompts. CPU only; ~10 min on 2 cores (32 seqs).
# Usage: scripts/train_tiny/export.sh RUN_DIR DEEPSERVE_BIN TOKENS_DIR WORK_DIR [NUM_SEQS]
set -euo pipefail
RUN=$1; DS=$2; DATA=$3; W=$4; NS=${5:-32}  # 32 = train.py --cpu-eval-seqs
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
mkdir -p "$W"
$PY "$HERE/merge_weights.py" "$W/master.safetensors" "$RUN"/weights-*.safetensors
rm -rf "$W/ckpt" "$W/expanded"
"$DS" make-checkpoint --from "$W/master.safetensors" --out "$W/ckpt"
$PY "$HERE/eval_master.py" --weights "$W/master.safetensors" --tokens "$DATA/heldout.u32" \
  --num-seqs "$NS" --json "$W/eval_master.json"
for mode in reference hf; do
  "$DS" eval-checkpoint --model "$W/ckpt" --tokens "$DATA/heldout.u32" --num-seqs "$NS" \
    --numerics $mode --json "$W/eval_ckpt_$mode.json" > /dev/null
done
$PY "$HERE/pack_artifact.py" --checkpoint "$W/ckpt" --master "$W/master.safetensors" \
  --out "$W/artifact.safetensors"
"$DS" make-checkpoint --from "$W/artifact.safetensors" --out "$W/expanded"
"$DS" eval-checkpoint --model "$W/expanded" --tokens "$DATA/heldout.u32" --num-seqs "$NS" \
  --numerics reference --json "$W/eval_expanded_reference.json" > /dev/null
for p in "The jury said" "In the morning, the"; do
  "$DS" generate --model "$W/expanded" --prompt "$p" --max-tokens 40 | tee -a "$W/generate.txt"
done
for f in eval_master eval_ckpt_reference eval_ckpt_hf eval_expanded_reference; do
  $PY -c "import json,sys; d=json.load(open('$W/$f.json')); print('$f', {k: round(d[k], 4) for k in ('main_nll','main_ppl','mtp_ppl','mtp_top1_vs_text','mtp_accept_vs_main_greedy')})"
done
ls -la "$W/artifact.safetensors"
