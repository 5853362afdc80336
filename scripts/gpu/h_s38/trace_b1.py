#!/usr/bin/env python3
"""Summary of a DS_SPARSE_MLA_TRACE=1 dump (sparse_mla_trace.cuh): the batch-1 plan's launches,
phase by phase, relative to the first CTA's entry of each launch (us, medians over the steady
launches of each timing series).   trace_b1.py DUMP"""
import statistics as st
import sys

dumps, cur = [], {"A": [], "C": []}
for line in open(sys.argv[1]):
    f = line.split()
    if not f:
        continue
    if f[0] == "E":
        dumps.append(cur)
        cur = {"A": [], "C": []}
    elif f[0] == "A":
        gen, cta, sm, keys, pdl = map(int, f[1:6])
        cur["A"].append((gen, cta, sm, keys, pdl, [int(x) for x in f[6:14]]))
    elif f[0] == "C":
        gen, blk, sm = map(int, f[1:4])
        cur["C"].append((gen, blk, sm, [int(x) for x in f[4:8]]))

names = ["entry", "pdl wait", "lengths", "addresses", "tile 0 dequant", "tile 0 scores",
         "tiles done", "exit"]
for d in dumps:
    att, comb = {}, {}
    for gen, cta, sm, keys, pdl, s in d["A"]:
        att.setdefault(gen, []).append((cta, sm, keys, pdl, s))
    for gen, blk, sm, s in d["C"]:
        comb.setdefault(gen, []).append((blk, sm, s))
    gens = sorted(att)
    if not gens:
        continue
    keys = max(k for _, _, k, _, _ in att[gens[-1]])
    # Series: consecutive launches with the same pdl flag; the last launch is the bench's
    # correctness launch, the two series before it are the graph and the graph with PDL.
    series, prev = [], None
    for g in gens:
        flag = att[g][0][3]
        if prev is None or flag != prev[0] or g != prev[1][-1] + 1:
            series.append((flag, [g]))
        else:
            series[-1][1].append(g)
        prev = series[-1]
    print(f"== keys {keys}: {len(gens)} launches, series {[(f, len(s)) for f, s in series]}")
    for flag, gs in series:
        if len(gs) < 40:
            continue
        gs = gs[-160:]  # the timed replays (20 x 8 launches)
        rows = {n: [] for n in names}
        med = {n: [] for n in names}
        extra = {k: [] for k in ["last entry", "working CTAs", "comb entry (first)",
                                 "comb wake (last)", "comb merged (last)", "comb end (last)",
                                 "next entry", "period", "last att exit"]}
        for g in gs:
            a = att[g]
            t0 = min(s[0] for _, _, _, _, s in a)
            extra["last entry"].append((max(s[0] for _, _, _, _, s in a) - t0) / 1e3)
            work = [s for _, _, _, _, s in a if s[3] != 0]
            extra["working CTAs"].append(len(work))
            for i, n in enumerate(names):
                v = [s[i] for s in work if s[i] != 0]
                if v:
                    rows[n].append((max(v) - t0) / 1e3)
                    med[n].append((st.median(v) - t0) / 1e3)
            extra["last att exit"].append((max(s[7] for _, _, _, _, s in a) - t0) / 1e3)
            c = comb.get(g, [])
            if c:
                extra["comb entry (first)"].append((min(s[0] for _, _, s in c) - t0) / 1e3)
                extra["comb wake (last)"].append((max(s[1] for _, _, s in c) - t0) / 1e3)
                extra["comb merged (last)"].append((max(s[2] for _, _, s in c) - t0) / 1e3)
                extra["comb end (last)"].append((max(s[3] for _, _, s in c) - t0) / 1e3)
            if g + 1 in att:
                t1 = min(s[0] for _, _, _, _, s in att[g + 1])
                extra["period"].append((t1 - t0) / 1e3)
        print(f"-- pdl={flag}, {len(gs)} launches (medians, us from the first CTA's entry; "
              f"phases: the median / the last working CTA to reach them)")
        for n in names:
            if rows[n]:
                print(f"   {n:>20s} {st.median(med[n]):7.2f} {st.median(rows[n]):7.2f}")
        for k, v in extra.items():
            if v:
                print(f"   {k:>20s} {st.median(v):7.2f}")
