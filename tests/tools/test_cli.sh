#!/usr/bin/env bash
# End-to-end tests of the deepserve CLI through its public entry point (the binary):
#   inspect on the real DeepSeek-V4-Flash config.json (config only) must print the figures of
#   dsv4-model.md (284.3B main parameters, 13.3B active, 145.3 GiB resident, 3850 B KV per token);
#   make-checkpoint writes a tiny checkpoint that inspect --full-scan validates; a damaged shard
#   and bad flags give a clear error and a non-zero exit, never a crash.
set -uo pipefail
bin="$1"
fixture="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
pass=0

expect_contains() {  # name, haystack, needle
  if grep -qF -- "$3" <<<"$2"; then pass=$((pass + 1)); else
    echo "FAIL $1: output lacks: $3"; echo "$2" | head -50; fails=$((fails + 1)); fi
}
expect_status() {  # name, expected, actual
  if [ "$2" = "$3" ]; then pass=$((pass + 1)); else echo "FAIL $1: exit $3, expected $2"; fails=$((fails + 1)); fi
}

out=$("$bin" inspect "$fixture" 2>&1); rc=$?
expect_status inspect_flash 0 $rc
expect_contains inspect_flash "$out" "43 layers (2 SWA, 21 CSA ratio 4, 20 HCA ratio 128) + 1 MTP"
expect_contains inspect_flash "$out" "main model 284.3B (284,332,240,471)"
expect_contains inspect_flash "$out" "active per token 13.3B"
expect_contains inspect_flash "$out" "MTP 6.6B"
expect_contains inspect_flash "$out" "resident weights: main model 145.30 GiB (156.0 GB)"
expect_contains inspect_flash "$out" "3850.25 B per token"
expect_contains inspect_flash "$out" "routed_expert"
expect_contains inspect_flash "$out" "GPUs of 141 GiB needed for the weights"
expect_contains inspect_flash "$out" ": 2"
expect_contains inspect_flash "$out" "weights: none in this directory"

out=$("$bin" make-checkpoint --preset tiny --seed 3 --out "$work/tiny" 2>&1); rc=$?
expect_status make_tiny 0 $rc
out=$("$bin" inspect --full-scan "$work/tiny" 2>&1); rc=$?
expect_status inspect_tiny 0 $rc
expect_contains inspect_tiny "$out" "headers and tensor set valid; every value finite"
expect_contains inspect_tiny "$out" "vocabulary 129280"

# generate: greedy is deterministic; seeded sampling is reproducible; a bad id is a clear error.
export OMP_WAIT_POLICY=passive
g1=$("$bin" generate --model "$work/tiny" --prompt-ids 5,6,7 --max-tokens 4 2>&1); rc=$?
expect_status generate_greedy 0 $rc
expect_contains generate_greedy "$g1" "generated ids: "
g2=$("$bin" generate --model "$work/tiny" --prompt-ids 5,6,7 --max-tokens 4 2>&1)
ids1=$(grep "generated ids" <<<"$g1"); ids2=$(grep "generated ids" <<<"$g2")
expect_contains generate_greedy_repeat "$ids2" "$ids1"
s1=$("$bin" generate --model "$work/tiny" --prompt "Hello world" --max-tokens 4 --temperature 1 --seed 9 2>&1 | grep "generated ids")
s2=$("$bin" generate --model "$work/tiny" --prompt "Hello world" --max-tokens 4 --temperature 1 --seed 9 2>&1 | grep "generated ids")
expect_contains generate_seeded "$s2" "$s1"
out=$("$bin" generate --model "$work/tiny" --prompt-ids 5,999999 --max-tokens 4 2>&1); rc=$?
expect_status generate_bad_id 1 $rc
expect_contains generate_bad_id "$out" "999999 is not below vocab_size"
# --device cuda: runs on a GPU (tests/runtime/test_cuda_ops, scripts/gpu/run_backend.sh); here,
# without CUDA in the build or without a GPU, it is a clear error, never a crash.
out=$("$bin" generate --model "$work/tiny" --prompt-ids 5,6,7 --max-tokens 2 --device cuda 2>&1); rc=$?
if [ $rc -ne 0 ]; then
  expect_status generate_cuda_unavailable 1 $rc
  expect_contains generate_cuda_unavailable "$out" "--device cuda"
fi
out=$("$bin" generate --model "$work/tiny" --prompt-ids 5 --device tpu 2>&1); rc=$?
expect_status generate_bad_device_fails 1 $(( rc != 0 ))
expect_contains generate_bad_device "$out" "--device"

# tokenize: text -> ids -> text round trip through the CLI.
ids=$("$bin" tokenize --no-special "Hello <｜User｜> world" 2>/dev/null | tr -d '\n'); rc=$?
expect_status tokenize 0 $rc
txt=$("$bin" tokenize --decode "$ids" 2>&1)
expect_contains tokenize_roundtrip "$txt" "Hello <｜User｜> world"

# profile: per-component times of decode steps and a prefill on the CPU backend, with floors.
out=$("$bin" profile --model "$work/tiny" --batch 2 --context 140 --steps 2 --prefill-tokens 32 \
      --output "$work/profile.json" 2>&1); rc=$?
expect_status profile_cpu 0 $rc
expect_contains profile_cpu "$out" "decode: 2 token(s) per step, 2 timed step(s)"
expect_contains profile_cpu "$out" "sparse attention"
expect_contains profile_cpu "$out" "components cover"
expect_contains profile_cpu "$out" "prefill: 32 token(s) per step"
expect_contains profile_json "$(cat "$work/profile.json" 2>&1)" '"seconds_per_step"'
out=$("$bin" profile --model "$work/tiny" --batch 0 2>&1); rc=$?
expect_status profile_bad_batch 2 $rc
expect_contains profile_bad_batch "$out" "error: profile: --batch must be in [1, 4096]"
out=$("$bin" profile --model "$work/tiny" --gpu a100 2>&1); rc=$?
expect_status profile_bad_gpu 2 $rc

# roofline: the DeepSeek-V4-Flash cost model of dsv4-model.md §13.4 (H200 at 4.8 TB/s).
out=$("$bin" roofline --preset flash --batch 16 --context 512 2>&1); rc=$?
expect_status roofline_b16 0 $rc
expect_contains roofline_b16 "$out" "decode step: batch 16, context 512"
expect_contains roofline_b16 "$out" "ideal decode: 1414 tok/s"
expect_contains roofline_b16 "$out" "U(16) = 80.84 of 256 per layer x 13.37 MB"
expect_contains roofline_b16 "$out" "5.19 MB per sequence"
out=$("$bin" roofline --preset flash --batch 1 --context 32768 2>&1)
expect_contains roofline_b1 "$out" "ideal decode: 427 tok/s"
out=$("$bin" roofline --preset flash --batch 64 --context 512 --json 2>&1); rc=$?
expect_status roofline_json 0 $rc
expect_contains roofline_json "$out" "\"tokens_per_s\""
out=$("$bin" roofline --gpu a100 2>&1); rc=$?
expect_status roofline_bad_gpu 2 $rc
expect_contains roofline_bad_gpu "$out" 'error: unknown GPU "a100"'
out=$("$bin" roofline --batch 0 2>&1); rc=$?
expect_status roofline_bad_batch 2 $rc

# A damaged shard: cut the last shard short.
last=$(ls "$work/tiny"/model-*.safetensors | tail -1)
truncate -s -100 "$last"
out=$("$bin" inspect "$work/tiny" 2>&1); rc=$?
expect_status inspect_truncated 1 $rc
expect_contains inspect_truncated "$out" "error: "
expect_contains inspect_truncated "$out" "rule 13"

# Bad flags and directories.
"$bin" make-checkpoint --preset huge --out "$work/x" >/dev/null 2>&1; rc=$?
[ $rc -ne 0 ] && [ $rc -lt 128 ] && pass=$((pass + 1)) || { echo "FAIL bad_preset: exit $rc"; fails=$((fails + 1)); }
out=$("$bin" make-checkpoint --preset tiny --out "$work/tiny" 2>&1); rc=$?
expect_status overwrite_refused 1 $rc
expect_contains overwrite_refused "$out" "already holds a checkpoint"
out=$("$bin" inspect "$work/does-not-exist" 2>&1); rc=$?
expect_status missing_dir 1 $rc
expect_contains missing_dir "$out" "not a directory"

echo "$pass passed, $fails failed"
[ $fails -eq 0 ]
