#!/usr/bin/env python3
"""Session 32: bench_sparse_mla JSON -> one table of graph times (us): the mma.sync plan, v7 and
v9 (producer warpgroup) at their plans, floor and v9 / floor; then the split sweeps of v7 / v9.
   summary.py RESULT.json"""
import json
import re
import sys

d = json.load(open(sys.argv[1]))
rec = d["records"]
print("gpu:", d.get("gpu"), "commit:", d.get("commit"), "copy GB/s:",
      [c for c in d.get("ceilings", [])] if isinstance(d.get("ceilings"), list) else d.get("ceilings"))
cases = {}
for r in rec:
    m = re.match(r"B=(\d+) ctx=(\d+)", r["shape"])
    if not m or r["mode"] != "graph":
        continue
    key = (int(m.group(1)), int(m.group(2)))
    c = cases.setdefault(key, {"floor": r["floor_us"], "err": {}})
    name = r["kernel"]
    if name == "sparse_mla_decode_alt":
        sp = re.search(r" s(\d+) ", r["shape"]).group(1)
        tag = ("v9" if " ws" in r["shape"] else "v7" if "wgmma" in r["shape"] else "ms") + "_s" + sp
        c[tag] = r["time_us"]
    else:
        c[name] = r["time_us"]
        c["err"][name] = r["max_error"]
        if name == "sparse_mla_decode_wgmma_ws":
            c["plan"] = re.search(r" s(\d+) ", r["shape"]).group(1)
print(f"{'case':>14} {'mma.sync':>9} {'v7':>8} {'v9':>8} {'v9 pdl':>8} {'floor':>7} {'v9/floor':>8} {'v9/v7':>6} {'plan':>5} {'worst err':>9}")
for (b, ctx), c in sorted(cases.items()):
    v7 = c.get("sparse_mla_decode_wgmma")
    v9 = c.get("sparse_mla_decode_wgmma_ws")
    ms = c.get("sparse_mla_decode")
    pdl = c.get("sparse_mla_decode_wgmma_ws_pdl")
    fl = c["floor"]
    err = max(c["err"].values()) if c["err"] else float("nan")
    f = lambda x: f"{x:8.2f}" if x is not None else "       -"
    print(f"{f'B={b} {ctx}':>14} {f(ms)} {f(v7)} {f(v9)} {f(pdl)} {fl:7.2f} "
          f"{(v9 / fl if v9 else 0):8.2f} {(v9 / v7 if v9 and v7 else 0):6.3f} s{c.get('plan', '?'):>4} {err:9.3f}")
print("split sweeps (graph us):")
for (b, ctx), c in sorted(cases.items()):
    sw = {k: v for k, v in c.items() if re.match(r"v[79]_s\d+", k)}
    if sw:
        print(f"  B={b} {ctx}: " + " ".join(f"{k}={v:.2f}" for k, v in sorted(sw.items())))
