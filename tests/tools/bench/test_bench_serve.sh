#!/usr/bin/env bash
# End-to-end: `deepserve bench` against a real `deepserve serve` on the embedded tiny model
# (CPU backend): starts the server on a free port, reads the URL it prints, benchmarks the
# completions and chat endpoints with a few requests and checks the result JSON (every request
# completed, exact output token totals with ignore_eos, positive TTFT/TPOT/ITL). Exits 77
# (skipped) while the binary has no `serve` subcommand. Run time: server start + ~10 requests of
# 8 tokens on the tiny model.
set -uo pipefail
bin="$1"
if ! "$bin" serve --help >/dev/null 2>&1; then
  echo "SKIP: this deepserve has no 'serve' subcommand yet (tools/deepserve/cmd_serve.cpp)"
  exit 77
fi
work=$(mktemp -d)
spid=""
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
export OMP_WAIT_POLICY=passive
"$bin" serve --host 127.0.0.1 --port 0 >"$work/serve.log" 2>&1 &
spid=$!
url=""
# It prints "listening on URL (loading the model)", then "ready on URL" once loaded.
for _ in $(seq 600); do
  url=$(grep 'ready on' "$work/serve.log" 2>/dev/null | grep -o 'http://127\.0\.0\.1:[0-9][0-9]*' | head -1)
  [ -n "$url" ] && break
  if ! kill -0 "$spid" 2>/dev/null; then echo "FAIL: deepserve serve exited"; cat "$work/serve.log"; exit 1; fi
  sleep 0.5
done
if [ -z "$url" ]; then echo "FAIL: deepserve serve not ready in 300 s"; cat "$work/serve.log"; exit 1; fi
echo "server at $url"
fails=0
check() {  # name, json file, JS expression over r
  if node -e "const r = require(process.argv[1]); if (!($3)) { console.error(JSON.stringify(r).slice(0, 2000)); process.exit(1); }" "$2"; then
    echo "ok $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}
for backend in openai openai-chat; do
  json="$work/$backend.json"
  "$bin" bench --base-url "$url" --backend "$backend" --num-prompts 4 --random-input-len 16 \
    --random-output-len 8 --ignore-eos --max-concurrency 2 --temperature 0 \
    --result-filename "$json" --disable-tqdm >"$work/$backend.out" 2>&1
  rc=$?
  cat "$work/$backend.out"
  if [ $rc -ne 0 ]; then echo "FAIL $backend: deepserve bench failed"; fails=$((fails + 1)); continue; fi
  check "$backend completed" "$json" "r.completed === 4 && r.failed === 0"
  check "$backend tokens" "$json" "r.total_output_tokens === 32 && r.output_lens.every(x => x === 8)"
  check "$backend input" "$json" "r.total_input_tokens >= 4 * 16"
  check "$backend timings" "$json" "r.mean_ttft_ms > 0 && r.mean_tpot_ms > 0 && r.mean_itl_ms > 0 && r.mean_e2el_ms >= r.mean_ttft_ms"
done
[ "$fails" -eq 0 ] && echo "bench_serve_e2e: passed"
[ "$fails" -eq 0 ]
