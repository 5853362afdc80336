#!/usr/bin/env bash
# Runs the libFuzzer builds of the fuzz targets for a fixed time each, one after the other, with
# each target's dictionary, starting from the committed corpus. New inputs and crash artifacts go
# to OUT_DIR/<target>/ (never into fuzz/corpus). Usage:
#   fuzz/run_libfuzzer.sh BUILD_DIR [SECONDS=60] [OUT_DIR=/tmp/ds_fuzz_out] [TARGET...]
# BUILD_DIR is a -DDEEPSERVE_LIBFUZZER=ON build (see fuzz/README.md). Exits non-zero when any
# target found a crash, a leak, a timeout or an out-of-memory input.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build=${1:?usage: run_libfuzzer.sh BUILD_DIR [SECONDS] [OUT_DIR] [TARGET...]}
seconds=${2:-60}
out=${3:-/tmp/ds_fuzz_out}
shift $(( $# < 3 ? $# : 3 ))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(fuzz_safetensors_header fuzz_shard_index fuzz_config_json fuzz_json_strict
           fuzz_tokenizer_json fuzz_bpe_roundtrip fuzz_stream_decoder fuzz_output_parser)
fi
declare -A dict=(
  [fuzz_safetensors_header]=safetensors.dict [fuzz_shard_index]=shard_index.dict
  [fuzz_config_json]=config.dict [fuzz_json_strict]=json.dict
  [fuzz_tokenizer_json]=tokenizer.dict [fuzz_bpe_roundtrip]=dsv4_text.dict
  [fuzz_output_parser]=dsv4_text.dict)
status=0
for t in "${targets[@]}"; do
  mkdir -p "$out/$t"
  args=(-max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1
        -artifact_prefix="$out/$t/")
  if [ -n "${dict[$t]:-}" ]; then args+=(-dict="$here/dict/${dict[$t]}"); fi
  echo "== $t (${seconds}s)"
  if ! "$build/fuzz/$t" "${args[@]}" "$out/$t" "$here/corpus/$t" >"$out/$t.log" 2>&1; then
    echo "   FINDING: see $out/$t.log and $out/$t/"
    status=1
  fi
  grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$out/$t.log" | sed 's/^/   /'
done
exit $status
