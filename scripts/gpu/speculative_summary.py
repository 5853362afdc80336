#!/usr/bin/env python3
"""Summary of scripts/gpu/run_speculative.sh: one record per (config, concurrency) with output
tok/s, TPOT, acceptance, the speed-up over k = 0 at the same concurrency, and how many requests
generated the same greedy text as k = 0 (prompts are the same: same seed and dataset)."""
import json
import os
import subprocess
import sys
import time

work, out = sys.argv[1], sys.argv[2]
records = []
base = {}
for name in ["k0", "k1", "k2", "k3", "adaptive3"]:
    if not any(os.path.exists(os.path.join(work, f"{name}_c{c}.json")) for c in [1, 16, 64]):
        continue
    for c in [1, 16, 64]:
        path = os.path.join(work, f"{name}_c{c}.json")
        if not os.path.exists(path):
            records.append({"config": name, "max_concurrency": c, "error": "no result"})
            continue
        r = json.load(open(path))
        rec = {"config": name, "max_concurrency": c,
               "completed": r.get("completed"), "output_throughput_tok_s": r.get("output_throughput"),
               "mean_tpot_ms": r.get("mean_tpot_ms"), "median_itl_ms": r.get("median_itl_ms"),
               "acceptance_rate_pct": r.get("spec_decode_acceptance_rate"),
               "acceptance_length": r.get("spec_decode_acceptance_length"),
               "draft_tokens": r.get("spec_decode_draft_tokens"),
               "accepted_tokens": r.get("spec_decode_accepted_tokens")}
        texts = r.get("generated_texts", [])
        if name == "k0":
            base[c] = (r.get("output_throughput"), texts)
        elif c in base:
            tput, btexts = base[c]
            if tput and rec["output_throughput_tok_s"]:
                rec["speedup_vs_k0"] = rec["output_throughput_tok_s"] / tput
            same = sum(1 for a, b in zip(texts, btexts) if a == b)
            rec["same_text_as_k0"] = f"{same}/{min(len(texts), len(btexts))}"
        records.append(rec)
try:
    commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
except Exception:
    commit = "unknown"
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
doc = {"benchmark": "speculative_decoding_gpu", "gpu": gpu, "commit": commit,
       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "model": "embedded tiny-brown-v1 (trained, docs/tiny_model.md)",
       "conditions": "deepserve serve --device cuda --max-num-seqs 64; deepserve bench, prompts "
                     "cut from the Brown corpus, 128 input / 128 output tokens, ignore_eos, "
                     "temperature 0, seed 7; 16 prompts at concurrency 1, 2 x concurrency otherwise",
       "records": records}
json.dump(doc, open(out, "w"), indent=1)
print(f"{'config':<10} {'conc':>4} {'tok/s':>9} {'TPOT ms':>8} {'accept%':>8} {'acc.len':>7} "
      f"{'speedup':>7} {'same text':>9}")
for r in records:
    if "error" in r:
        print(f"{r['config']:<10} {r['max_concurrency']:>4} {r['error']}")
        continue
    f = lambda v, fmt: (fmt % v) if isinstance(v, (int, float)) else "-"
    print(f"{r['config']:<10} {r['max_concurrency']:>4} {f(r['output_throughput_tok_s'], '%.1f'):>9} "
          f"{f(r['mean_tpot_ms'], '%.2f'):>8} {f(r['acceptance_rate_pct'], '%.1f'):>8} "
          f"{f(r['acceptance_length'], '%.2f'):>7} {f(r.get('speedup_vs_k0'), '%.2f'):>7} "
          f"{r.get('same_text_as_k0', '-'):>9}")
