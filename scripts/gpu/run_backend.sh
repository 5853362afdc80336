#!/usr/bin/env bash
# The CUDA backend on the GPU machine, in one call: the whole-model GPU-vs-CPU tests, `deepserve
# generate --device cuda` and `serve --device cuda` on the embedded tiny model (with the KV paging
# check, scripts/gpu/check_kv_paging.py), and `deepserve profile --device cuda` of
# Flash-geometry decode steps (a synthetic checkpoint with the first LAYERS layers of
# DeepSeek-V4-Flash, written to /dev/shm). The binaries are built on the dev machine (the GPU
# machine lacks the Debian -dev packages the full build needs) by scripts/gpu/pack_backend.sh
# into build/carry, which travels with the `run` tool's `carry`.
#
#   scripts/gpu/run_backend.sh [OUT_DIR] [--layers N] [--profiles "1:512 16:512 64:512"]
#                              [--no-tests] [--no-profile] [--eval TOKENS] [--spec DATASET]
#                              [--gemm] [--kernels]
# --profiles lists batch:context pairs for `deepserve profile --device cuda`.
# --eval: held-out perplexity of the embedded model on the CUDA backend (eval-checkpoint, 32
# sequences of 256 tokens of the uint32 token file, as docs/tiny_model.md's CPU check).
# --spec: scripts/gpu/run_speculative.sh with prompts cut from DATASET (a Brown-corpus directory
# or a text file).
# --gemm: test_gemm_cuda and bench_gemm_fp8 in decode mode (when pack_backend.sh packed them).
# --kernels: test_moe_cuda, test_indexer_cuda, test_ops_cuda and bench_ops (when packed).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-bench/results}}"
shift || true
layers=4
profiles="1:512 16:512 64:512"
tests=1
profile=1
eval_tokens=""
spec_dataset=""
gemm=0
kernels=0
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift ;;
    --profiles) profiles="$2"; shift ;;
    --no-tests) tests=0 ;;
    --no-profile) profile=0 ;;
    --eval) eval_tokens="$2"; shift ;;
    --spec) spec_dataset="$2"; shift ;;
    --gemm) gemm=1 ;;
    --kernels) kernels=1 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
json_out="$out"
out=/tmp/backend_logs  # logs stay on the machine except those copied back at the end
rm -rf "$out"; mkdir -p "$out"
carry=build/carry
if [ -f build/carry/backend.tar.xz ]; then  # pack_backend.sh's compressed form
  carry=/tmp/carry
  rm -rf "$carry"; mkdir -p "$carry"
  xz -dc build/carry/backend.tar.xz | tar -C "$carry" -xf -
fi
export LD_LIBRARY_PATH="$(cd "$carry" && pwd)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DEEPSERVE_CACHE_DIR=/dev/shm/deepserve-cache
# Provenance of the JSON results: the tree pack_backend.sh built the binaries from.
if [ -z "${DS_COMMIT:-}" ] && [ -f build/carry/COMMIT ]; then
  DS_COMMIT=$(cat build/carry/COMMIT)
  export DS_COMMIT
fi
summary=()
failed=0
step() {  # name, command...
  local name="$1"; shift
  local t0=$(date +%s)
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-34s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
  [ $rc -eq 0 ] || { tail -25 "$out/$name.log"; failed=1; }
  return $rc
}

if [ $tests -eq 1 ]; then
  step test_elementwise_cuda "$carry/test_elementwise_cuda"
  grep -E "^\[  (PASSED|FAILED) " "$out/test_elementwise_cuda.log"
  if ! step test_cuda_ops "$carry/test_cuda_ops"; then
    # Find the first bad access, if that is what broke it.
    compute-sanitizer --tool memcheck --print-limit 5 "$carry/test_cuda_ops" \
      --gtest_filter='*PrefillMatchesCpu*' >"$out/memcheck_cuda_ops.log" 2>&1
    grep -m 12 -E "Invalid|at 0x|by thread|ERROR SUMMARY|Failure" "$out/memcheck_cuda_ops.log"
  fi
  grep -E "^\[ +(PASSED|FAILED|SKIPPED|OK) |\[ metric \]|Failure|error|Expected|Which is" \
    "$out/test_cuda_ops.log" | head -40
  step generate_tiny_cuda "$carry/deepserve" generate --device cuda --prompt "The capital of France is" \
    --max-tokens 24 --ignore-eos
  step generate_tiny_cpu "$carry/deepserve" generate --device cpu --prompt "The capital of France is" \
    --max-tokens 24 --ignore-eos
  grep -E "generated ids|device|decode" "$out"/generate_tiny_*.log
  # The server on the GPU: one chat completion through the OpenAI-compatible API.
  "$carry/deepserve" serve --device cuda --port 18080 --max-num-seqs 8 >"$out/serve_cuda.log" 2>&1 &
  spid=$!
  for _ in $(seq 1 60); do curl -sf localhost:18080/health >/dev/null 2>&1 && break; sleep 1; done
  step serve_cuda_completion curl -sf localhost:18080/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"deepseek-v4-tiny","prompt":"Hello, my name is","max_tokens":16,"temperature":0}'
  cat "$out/serve_cuda_completion.log"; echo
  kill $spid 2>/dev/null; wait $spid 2>/dev/null
  grep -E "device|error" "$out/serve_cuda.log" | head -5
  # KV paging through the server: a roomy and a tight page pool (preemption), same requests.
  step kv_paging timeout 300 python3 scripts/gpu/check_kv_paging.py "$carry/deepserve" \
    "$json_out/kv_paging_gpu.json"
  tail -3 "$out/kv_paging.log"
fi

if [ $gemm -eq 1 ] && [ -x "$carry/bench_gemm_fp8" ]; then
  step test_gemm_cuda timeout 120 "$carry/test_gemm_cuda"
  grep -E "^\[  (PASSED|FAILED) |Failure" "$out/test_gemm_cuda.log" | head -10
  step bench_gemm_fp8 timeout 120 "$carry/bench_gemm_fp8" "$json_out/gemm_fp8_decode.json" decode
  grep -E "floor|ceilings" "$out/bench_gemm_fp8.log" | head -60
fi

if [ $kernels -eq 1 ]; then
  for t in test_moe_cuda test_indexer_cuda test_ops_cuda; do
    [ -x "$carry/$t" ] || { summary+=("$t: not packed"); continue; }
    step "$t" timeout 150 "$carry/$t"
    grep -E "^\[  (PASSED|FAILED) |Failure" "$out/$t.log" | head -10
  done
  if [ -x "$carry/bench_ops" ]; then  # norms, RoPE, mHC, compressors, sampling: ops.json
    step bench_ops timeout 150 "$carry/bench_ops" "$json_out/ops.json"
    grep -E "mhc|ceiling" "$out/bench_ops.log" | head -20
  fi
fi

if [ -n "$eval_tokens" ]; then
  model=$("$carry/deepserve" inspect 2>/dev/null | head -1)  # expands the embedded model
  step eval_cuda "$carry/deepserve" eval-checkpoint --device cuda --model "$model" \
    --tokens "$eval_tokens" --num-seqs 32 --json "$json_out/eval_tiny_brown_cuda.json"
  tail -12 "$out/eval_cuda.log"
fi

if [ -n "$spec_dataset" ]; then
  step speculative bash scripts/gpu/run_speculative.sh "$carry/deepserve" \
    "$json_out/speculative_gpu.json" "$spec_dataset"
  tail -20 "$out/speculative.log"
fi

if [ $profile -eq 1 ]; then
  model=/dev/shm/flash$layers
  rm -rf "$model"
  step make_flash timeout 150 "$carry/deepserve" make-checkpoint --preset flash --layers "$layers" --out "$model" \
    --no-verify
  for bc in $profiles; do
    b=${bc%%:*}
    ctx=${bc##*:}
    step "profile_b${b}_c${ctx}" timeout 150 "$carry/deepserve" profile --device cuda --model "$model" \
      --batch "$b" --context "$ctx" --steps 6 --warmup 2 \
      --output "$json_out/profile_flash${layers}_b${b}_c${ctx}.json"
    sed -n '6,18p' "$out/profile_b${b}_c${ctx}.log"
  done
  rm -rf "$model"
fi
cp "$out"/test_cuda_ops.log "$out"/generate_tiny_cuda.log "$json_out"/ 2>/dev/null
# The other logs in one file (the run tool returns at most 8 files).
tar -C "$out" -czf "$json_out/backend_logs.tgz" . 2>/dev/null
echo "---- summary ----"
printf '%s\n' "${summary[@]}"
exit $failed
