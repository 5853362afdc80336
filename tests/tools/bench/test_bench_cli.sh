#!/usr/bin/env bash
# `deepserve bench` through the binary against bench_fake_server (scripted delays: first token
# after 30 ms, then one every 10 ms): the table, the result JSON (checked with node), an
# environment variable, a concurrency sweep with its SVG plots, and bad flags / an unreachable
# server giving a clear error and exit code. Run time ~20 s (tokenizer load per invocation).
set -uo pipefail
bin="$1"
fake="$2"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$work"; }
trap cleanup EXIT
fails=0
pass=0
expect_contains() {  # name, haystack, needle
  if grep -qF -- "$3" <<<"$2"; then pass=$((pass + 1)); else
    echo "FAIL $1: output lacks: $3"; echo "$2" | head -60; fails=$((fails + 1)); fi
}
expect_status() {  # name, expected, actual
  if [ "$2" = "$3" ]; then pass=$((pass + 1)); else echo "FAIL $1: exit $3, expected $2"; fails=$((fails + 1)); fi
}
expect_js() {  # name, json file, JS expression over `r` that must be true
  if node -e "const r = require(process.argv[1]); if (!($3)) { console.error(JSON.stringify(r).slice(0, 1500)); process.exit(1); }" "$2"; then
    pass=$((pass + 1)); else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}
start_fake() {  # log file, extra flags... ; sets $url
  local log="$1"; shift
  "$fake" "$@" >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" 2>/dev/null | head -1)
    [ -n "$url" ] && return 0
    sleep 0.1
  done
  echo "FAIL: bench_fake_server did not start"; cat "$log"; exit 1
}

start_fake "$work/fake.log" --ttft-ms 30 --itl-ms 10

# One run: 8 prompts of 64 tokens, 5 output tokens, 4 in flight.
out=$("$bin" bench --base-url "$url" --num-prompts 8 --random-input-len 64 --random-output-len 5 \
      --max-concurrency 4 --ignore-eos --result-filename "$work/run.json" --disable-tqdm 2>&1); rc=$?
expect_status run 0 $rc
expect_contains run "$out" "============ Serving Benchmark Result ============"
expect_contains run "$out" "Successful requests:                     8"
expect_contains run "$out" "Max request concurrency:                 4"
expect_contains run "$out" "Mean TPOT (ms):"
expect_contains run "$out" "P99 ITL (ms):"
expect_contains run "$out" "Acceptance rate (%):                     75.00"
expect_js run_json "$work/run.json" "r.completed === 8 && r.failed === 0 && r.model_id === 'fake-model'"
expect_js run_json "$work/run.json" "r.total_output_tokens === 40 && r.total_input_tokens === 56"
# Scripted delays, +-5 ms for the wall clock of a loaded machine.
expect_js run_json "$work/run.json" "Math.abs(r.mean_ttft_ms - 30) < 5 && Math.abs(r.median_tpot_ms - 10) < 5"
# The end-to-end latency sums five scripted delays (30 + 4 x 10 ms), and a loaded machine only adds
# to each (a CI run next to two compilers measured 77.8 ms): -5 / +20 ms.
expect_js run_json "$work/run.json" "Math.abs(r.mean_itl_ms - 10) < 5 && r.mean_e2el_ms > 65 && r.mean_e2el_ms < 90"
expect_js run_json "$work/run.json" "r.itls.length === 8 && r.itls.every(x => x.length === 4) && r.max_concurrent_requests <= 4"
expect_js run_json "$work/run.json" "r.request_rate === 'inf' && r.max_concurrency === 4 && r.random_input_len === 64"

# The environment mirrors the flags; without usage the dataset's prompt lengths are reported.
start_fake "$work/fake2.log" --ttft-ms 5 --itl-ms 2 --no-usage
out=$(DEEPSERVE_BENCH_NUM_PROMPTS=3 DEEPSERVE_BENCH_RANDOM_INPUT_LEN=48 \
      "$bin" bench --base-url "$url" --random-output-len 4 --num-warmups 0 --request-rate 50 \
      --result-filename "$work/env.json" 2>&1); rc=$?
expect_status env 0 $rc
expect_js env_json "$work/env.json" "r.completed === 3 && r.input_lens.every(x => x === 48) && r.request_rate === 50"
expect_js env_json "$work/env.json" "r.output_lens.every(x => x === 4)"  # re-tokenized ' tok tok tok tok'
expect_contains env_progress "$out" "benchmark: 3/3"

# Concurrency sweep: one run per concurrency, JSON with every run, two SVG plots.
out=$("$bin" bench --base-url "$url" --num-prompts 4 --random-input-len 32 --random-output-len 3 \
      --sweep 1,2 --result-dir "$work/sweep" --plot-prefix "$work/sweep/plot" --disable-tqdm 2>&1); rc=$?
expect_status sweep 0 $rc
expect_contains sweep "$out" "Concurrency sweep"
sweep_json=$(ls "$work"/sweep/*-sweep-*.json 2>/dev/null | head -1)
if [ -n "$sweep_json" ]; then
  expect_js sweep_json "$sweep_json" "r.runs.length === 2 && r.runs[0].max_concurrency === 1 && r.runs[1].max_concurrency === 2"
  expect_js sweep_json "$sweep_json" "r.runs.every(x => x.completed === 4) && r.sweep_concurrency.join() === '1,2'"
else
  echo "FAIL sweep: no *-sweep-*.json in $work/sweep"; ls "$work/sweep"; fails=$((fails + 1))
fi
for plot in throughput tpot; do
  f="$work/sweep/plot_$plot.svg"
  if [ -s "$f" ] && head -2 "$f" | grep -q "<svg" && tail -1 "$f" | grep -q "</svg>" &&
     [ "$(grep -c '<polyline' "$f")" -ge 2 ]; then pass=$((pass + 1)); else
    echo "FAIL sweep plot $f"; fails=$((fails + 1)); fi
done

# Bad flags: exit 2 with a message naming the flag; unreachable server: exit 1.
out=$("$bin" bench --base-url "$url" --request-rate fast 2>&1); rc=$?
expect_status bad_rate 2 $rc
expect_contains bad_rate "$out" "--request-rate must be a positive number or inf"
out=$("$bin" bench --base-url "$url" --backend grpc 2>&1); rc=$?
expect_status bad_backend 2 $rc
expect_contains bad_backend "$out" "--backend must be openai or openai-chat"
out=$("$bin" bench --base-url "$url" --dataset-name sharegpt 2>&1); rc=$?
expect_status sharegpt_no_path 2 $rc
out=$("$bin" bench --base-url "$url" --sweep 0,4 2>&1); rc=$?
expect_status bad_sweep 2 $rc
out=$("$bin" bench --base-url https://example.com 2>&1); rc=$?
expect_status https 2 $rc
expect_contains https "$out" "https is not supported"
out=$("$bin" bench --base-url "http://127.0.0.1:1" --num-prompts 2 --random-input-len 8 2>&1); rc=$?
expect_status unreachable 1 $rc
expect_contains unreachable "$out" "error: finding the model (give --model)"
out=$("$bin" bench --base-url "http://127.0.0.1:1" --model m --num-prompts 2 --random-input-len 8 --disable-tqdm 2>&1); rc=$?
expect_status unreachable_model 1 $rc
expect_contains unreachable_model "$out" "every warm-up request failed"

echo "bench_cli: $pass passed, $fails failed"
[ "$fails" -eq 0 ]
