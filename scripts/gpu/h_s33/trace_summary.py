#!/usr/bin/env python3
"""Session 33: the phase stamps of a DS_SPARSE_MLA_WS_TRACE=1 build of v9 (lines "wstrace ROW K
CLOCK" on stdin; rows 0 / 1 = consumer warpgroups 0 / 1, row 2 = producer) -> one table per role
of phase lengths per tile, in us at GHZ (default 1.98). Stamps (sparse_mla_decode_ws.cuh):
consumer 0 start, 1 q in shared memory, per tile j at 2 + 7 j: before the full wait, after it,
before / after the max exchange's barrier, before / after the P exchange's barrier, after PV;
199 / 210 around finish. Producer 0 start, 1 addresses resolved, per tile n at 2 + 3 n: loop
start, copies issued (after the empty wait), tile converted; since session 35, at 226 + 3 (4 n + i)
for the first two tiles' conversion units i: before / after the wait for the unit's copies,
unit converted.
   trace_summary.py [GHZ] < LOG"""
import re
import sys

ghz = float(sys.argv[1]) if len(sys.argv) > 1 else 1.98
st = {}
for line in sys.stdin:
    m = re.match(r"wstrace (\d+) (\d+) (-?\d+)", line.strip())
    if m:
        st.setdefault(int(m.group(1)), {})[int(m.group(2))] = int(m.group(3))
if not st:
    sys.exit("no wstrace lines")
t0 = min(min(v.values()) for v in st.values())
us = lambda c: (c) / (ghz * 1000.0)
for row in (0, 1):
    s = st.get(row)
    if not s:
        continue
    print(f"consumer warpgroup {row}: q ready at {us(s[1] - t0):.2f} us")
    print("  tile  start  fullwait  qk+max  bar1   exp+P   bar2   pv+fold   (us)")
    j = 0
    while 2 + 7 * j in s and 8 + 7 * j in s:
        b = 2 + 7 * j
        d = lambda a, c: us(s[b + c] - s[b + a])
        print(f"  {j:4d} {us(s[b] - t0):6.2f} {d(0, 1):9.2f} {d(1, 2):7.2f} {d(2, 3):5.2f} "
              f"{d(3, 4):7.2f} {d(4, 5):6.2f} {d(5, 6):9.2f}")
        j += 1
    if 199 in s and 210 in s:
        print(f"  finish {us(s[199] - t0):.2f} -> {us(s[210] - t0):.2f} us ({us(s[210] - s[199]):.2f})")
s = st.get(2)
if s:
    print(f"producer: addresses resolved at {us(s[1] - t0):.2f} us")
    print("  tile  start  wait+issue  convert  done at (us)")
    n = 0
    while 2 + 3 * n in s and 4 + 3 * n in s:
        b = 2 + 3 * n
        print(f"  {n:4d} {us(s[b] - t0):6.2f} {us(s[b + 1] - s[b]):10.2f} {us(s[b + 2] - s[b + 1]):8.2f} "
              f"{us(s[b + 2] - t0):8.2f}")
        n += 1
    for n in range(2):  # the first two tiles' conversion units (session 35 trace builds)
        b = [226 + 3 * (4 * n + i) for i in range(4)]
        if all(k + 2 in s for k in b):
            print(f"  tile {n} units (wait / convert, us): " + "  ".join(
                f"{us(s[k + 1] - s[k]):.2f}/{us(s[k + 2] - s[k + 1]):.2f}" for k in b))
