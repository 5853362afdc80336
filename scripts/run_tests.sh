#!/usr/bin/env bash
# The test command: builds the CPU configuration and runs every test that needs no GPU under
# ctest, then the hostile-input suites (checkpoint catalogue, JSON, tokenizer) again under
# AddressSanitizer + UBSan. GPU tests (label gpu) skip themselves without a GPU.
# Fails when a test fails and when no test ran.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# ctest runs several OpenMP test binaries at once on few cores: spinning idle threads would steal
# the cores the others need (a 100x slowdown was seen on 2 cores).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

cmake --preset cpu-release >/dev/null
cmake --build --preset cpu-release -j"$jobs"
ctest --preset cpu-release --no-tests=error -j"$jobs"

# Hostile-input catalogues under ASan + UBSan (reliability.md §4.2).
cmake --preset cpu-asan >/dev/null
asan_targets=(test_core test_json)
asan_targets+=(fuzz_safetensors_header fuzz_shard_index fuzz_config_json fuzz_json_strict fuzz_tokenizer_json fuzz_bpe_roundtrip fuzz_stream_decoder fuzz_output_parser)
for t in test_model test_tokenizer test_server_protocol; do
  if grep -q "^$t:" <(ninja -C build/cpu-asan -t targets all 2>/dev/null); then asan_targets+=("$t"); fi
done
cmake --build --preset cpu-asan -j"$jobs" --target "${asan_targets[@]}"
ctest --preset cpu-asan --no-tests=error -j"$jobs" -L asan
