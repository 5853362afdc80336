#!/usr/bin/env python3
"""Session 38: bench_sparse_mla "small" JSON -> one line per case (graph us): the plan's
mma.sync kernel (graph / PDL), v9 (graph / PDL), the mma.sync split sweep, worst error.
   small.py RESULT.json"""
import json
import re
import sys

d = json.load(open(sys.argv[1]))
cases = {}
for r in d["records"]:
    m = re.match(r"B=(\d+) ctx=(\d+)", r["shape"])
    if not m or r["mode"] != "graph":
        continue
    c = cases.setdefault((int(m.group(1)), int(m.group(2))), {"err": 0.0})
    k = r["kernel"]
    if k == "sparse_mla_decode_alt":
        if "wgmma" in r["shape"] or " p2" in r["shape"]:
            continue
        h = re.search(r" h(\d+) ", r["shape"]).group(1)  # session 43: 32 / 64-head rows
        c["s" + re.search(r" s(\d+) ", r["shape"]).group(1) + ("" if h == "16" else "h" + h)] = \
            r["time_us"]
    else:
        c[k] = r["time_us"]
        c["err"] = max(c["err"], r.get("max_error", 0.0))
        if k == "sparse_mla_decode":
            c["plan"] = re.search(r" (s\d+ h\d+)", r["shape"]).group(1)
f = lambda x: f"{x:7.2f}" if x is not None else "      -"
print(f"{'case':>10} {'plan':>8} {'ms':>7} {'ms pdl':>7} {'v9':>7} {'v9 pdl':>7}  sweep (ms)  err")
for (b, ctx), c in sorted(cases.items()):
    sw = " ".join(f"{k}:{v:.2f}" for k, v in sorted(c.items()) if re.fullmatch(r"s\d+(h\d+)?", k))
    print(f"{f'B={b} {ctx}':>10} {c.get('plan', '-'):>8} {f(c.get('sparse_mla_decode'))} "
          f"{f(c.get('sparse_mla_decode_pdl'))} {f(c.get('sparse_mla_decode_wgmma_ws'))} "
          f"{f(c.get('sparse_mla_decode_wgmma_ws_pdl'))}  {sw}  {c['err']:.3f}")
