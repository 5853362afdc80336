#!/usr/bin/env python3
"""The SASS instructions of an `ncu --page source --csv --print-source sass` export that have
warp-stall samples, in address order, with their share of the samples and their two largest stall
reasons (compact text, for reading a kernel's hot loop off the GPU machine; gzip it).
   sass_dump.py FILE.csv > OUT.txt"""
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline='')))
hdr_i = next((i for i, r in enumerate(rows) if any(c.strip() == 'Source' for c in r)), None)
if hdr_i is None:
    sys.exit('no Source column')
hdr = rows[hdr_i]
body = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
def col(name):
    return next((i for i, c in enumerate(hdr) if c.startswith(name)), None)
src, samp, addr = col('Source'), col('Warp Stall Sampling (All'), col('Address')
stall = [i for i, c in enumerate(hdr) if c.startswith('stall_') and '(Not Issued)' not in c]
def f(x):
    try:
        return float(x)
    except ValueError:
        return 0.0
tot = sum(f(r[samp]) for r in body) or 1
for r in body:
    if f(r[samp]) <= 0:
        continue
    top = sorted(((f(r[i]), hdr[i][6:]) for i in stall), reverse=True)[:2]
    why = ' '.join(f'{n}:{v:.0f}' for v, n in top if v > 0)
    print(f'{r[addr] if addr is not None else ""} {f(r[samp]) / tot * 100:5.2f} {r[src].strip()[:80]:80s} {why}')
