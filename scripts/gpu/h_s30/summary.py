#!/usr/bin/env python3
"""Session 30: the indexer bench's graph times per (batch, context), one column per series
(main = the tree; sepmerge / mk2 / fullsearch / nocompact / nocap = one change undone;
s29 = all), the floor
and main's ratio to it.   summary.py indexer.json"""
import json
import re
import sys

d = json.load(open(sys.argv[1]))
rows = {}
for r in d["records"]:
    k = r["kernel"]
    if not k.startswith("indexer_select") or r["mode"] != "graph":
        continue
    series = "main" if k == "indexer_select" else k[len("indexer_select_"):]
    m = re.match(r"B=(\d+) ctx=(\d+) .*maxlen=(\d+) splits=(\d+)", r["shape"])
    b, ctx, maxlen, splits = map(int, m.groups())
    if series == "maxlen":
        series = "maxlen%dK" % (maxlen // 1024)
    rows.setdefault((b, ctx), {})[series] = (r["time_us"], splits, r["floor_us"], r["max_error"])
cols = ["main", "sepmerge", "mk2", "fullsearch", "nocompact", "nocap", "s29", "onesplit", "maxlen8K", "maxlen1024K"]
print("gpu %s, commit %s, copy %.0f GB/s" % (d["gpu"], d["commit"], d["ceilings"]["copy_gbps"]))
print("%-14s" % "B ctx" + "".join("%13s" % c for c in cols) + "   floor  main/floor  err")
for (b, ctx), s in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
    line = "%-14s" % ("B=%d %dK" % (b, ctx // 1024) if ctx >= 1024 else "B=%d %d" % (b, ctx))
    for c in cols:
        line += "%13s" % ("%.2f s%d" % (s[c][0], s[c][1]) if c in s else "-")
    any_s = next(iter(s.values()))
    main = s.get("main")
    line += "  %6.2f  %8s  %.3f" % (any_s[2], "%.2fx" % (main[0] / main[2]) if main else "-",
                                    max(v[3] for v in s.values()))
    print(line)
