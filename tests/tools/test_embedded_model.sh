#!/usr/bin/env bash
# The embedded default model (tiny-brown-v1, docs/tiny_model.md) through the binary: expanded from
# the linked-in artifact into a fresh cache directory, it reproduces the training script's
# held-out NLL and MTP acceptance (tests/fixtures/tiny_brown: numbers from PyTorch on the bf16
# master weights, not from deepserve) within the export's tolerance, and greedy generation
# continues English text with known words.
set -uo pipefail
bin="$1"
fixture="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export DEEPSERVE_CACHE_DIR="$work/cache"
export OMP_WAIT_POLICY=passive
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

dir=$("$bin" inspect 2>/dev/null | head -1)
[ -f "$dir/config.json" ] || fail "inspect did not expand the embedded model (got '$dir')"
case "$dir" in */tiny-brown-v1) ;; *) fail "embedded model directory $dir is not tiny-brown-v1" ;; esac

"$bin" eval-checkpoint --model "$dir" --tokens "$fixture/heldout_2x256.u32" --num-seqs 2 \
  --json "$work/eval.json" >"$work/eval.log" 2>&1 || { cat "$work/eval.log"; fail "eval-checkpoint"; }
python3 - "$work/eval.json" "$fixture/master_eval_2x256.json" <<'PY' || fail "held-out numbers"
import json, sys
got, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(f"main NLL {got['main_nll']:.4f} (master {want['main_nll']:.4f}); MTP accept "
      f"{got['mtp_accept_vs_main_greedy']:.3f} (master {want['mtp_accept_vs_main_greedy']:.3f})")
ok = abs(got["main_nll"] - want["main_nll"]) <= 0.02
ok &= abs(got["mtp_nll"] - want["mtp_nll"]) <= 0.02
ok &= abs(got["mtp_accept_vs_main_greedy"] - want["mtp_accept_vs_main_greedy"]) <= 0.05
sys.exit(0 if ok else 1)
PY

# Bad arguments to eval-checkpoint are clear errors, never a crash.
out=$("$bin" eval-checkpoint --model "$dir" --tokens "$fixture/heldout_2x256.u32" --device tpu 2>&1)
[ $? -eq 1 ] && grep -q "device" <<<"$out" || fail "eval-checkpoint --device tpu: $out"
out=$("$bin" eval-checkpoint --model "$dir" --tokens "$work/missing.u32" 2>&1)
[ $? -eq 1 ] && grep -q "cannot open" <<<"$out" || fail "eval-checkpoint missing tokens: $out"
head -c 40 "$fixture/heldout_2x256.u32" > "$work/short.u32"
out=$("$bin" eval-checkpoint --model "$dir" --tokens "$work/short.u32" 2>&1)
[ $? -eq 1 ] && grep -q "not enough tokens" <<<"$out" || fail "eval-checkpoint short file: $out"

# Greedy continuation: most generated words are ordinary English words from a short list of
# the commonest ones (a random-weight model produces fragments of arbitrary tokens instead).
out=$("$bin" generate --prompt "She looked at him and" --max-tokens 40 2>&1) || fail "generate"
text=$(sed -n 's/^generated text: //p' <<<"$out")
echo "continuation: $text"
common=" the a an and of to in that was he she him her it is for on with as his at by had not be
        have this from or but were are they which one you all we their been has would there who
        so if out up into do said what when no more them could about my than then me went door
        i going time man made first new state states united president government said "
total=0; known=0
for w in $(tr -c "A-Za-z'\n" ' ' <<<"$text" | tr 'A-Z' 'a-z'); do
  total=$((total + 1))
  case "$common" in *" $w "*) known=$((known + 1)) ;; esac
done
echo "common words: $known of $total"
[ "$total" -ge 5 ] && [ $((known * 2)) -ge "$total" ] || fail "continuation is not English-like"

if [ $fails -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "embedded model checks passed"
