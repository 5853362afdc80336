#!/usr/bin/env python3
"""Top SASS instructions by warp-stall samples from `ncu --page source --csv --print-source sass`.
   sass_top.py FILE.csv [N]"""
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1], newline='')))
n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
hdr_i = next((i for i, r in enumerate(rows) if any(c.strip() == 'Source' for c in r)), None)
if hdr_i is None:
    print('no Source column; first lines:')
    for r in rows[:6]:
        print(str(r)[:300])
    sys.exit(0)
hdr = rows[hdr_i]
body = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
def col(name):
    for i, c in enumerate(hdr):
        if c.startswith(name):
            return i
    return None
src = col('Source'); samp = col('Warp Stall Sampling (All'); addr = col('Address')
stall_cols = [i for i, c in enumerate(hdr) if c.startswith('stall_') or c.startswith('Stall')]
def f(x):
    try: return float(x)
    except: return 0.0
tot = sum(f(r[samp]) for r in body) or 1
print(f'total samples {tot:.0f}, instructions {len(body)}')
byop = collections.Counter()
for r in body:
    op = r[src].strip().split()[0] if r[src].strip() else '?'
    if op.startswith('@'):
        op = r[src].strip().split()[1]
    byop[op.split('.')[0]] += f(r[samp])
stall_all = [i for i, c in enumerate(hdr) if c.startswith('stall_') and '(Not Issued)' not in c]
tot_st = collections.Counter()
for r in body:
    for i in stall_all:
        tot_st[hdr[i]] += f(r[i])
st_sum = sum(tot_st.values()) or 1
print('stalls:', ', '.join(f'{k[6:]} {v/st_sum*100:.1f}%' for k, v in tot_st.most_common(12)))
print('by opcode:', ', '.join(f'{k} {v/tot*100:.1f}%' for k, v in byop.most_common(20)))
for r in sorted(body, key=lambda r: -f(r[samp]))[:n]:
    top = sorted(((f(r[i]), hdr[i][6:]) for i in stall_all), reverse=True)[:2]
    why = ' '.join(f'{n}:{v:.0f}' for v, n in top if v > 0)
    print(f'{f(r[samp])/tot*100:5.1f}%  {r[src][:70]:70s} {why}')
